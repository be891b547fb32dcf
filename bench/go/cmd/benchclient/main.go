// Command benchclient drives an externalgrpc CloudProvider over mTLS the way Cluster
// Autoscaler's externalgrpc client does (one connection, one timeout per RPC, calls one after
// another) and prints its measurements as one JSON object on stdout.
//
//	benchclient single   -rpc NodeGroupForNode|TargetSize|GetOptions [-provider-id ID] [-group G]
//	benchclient single   -rpc TemplateNodeInfo|IncreaseSize|DeleteNodes -group G [-nodes nodes.json]
//	benchclient loop     -nodes nodes.json -loops K [-static-lookups K -options-per-node K
//	                     -target-sizes-per-group K -templates K]
//	benchclient refresh  -calls K
//	benchclient increase -group G -delta 100 -emulator http://127.0.0.1:PORT -expect N
//
// Every mode is bounded in calls and in time (-max-seconds).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"cloudscale-autoscaler/bench/internal/mtls"
	pb "cloudscale-autoscaler/bench/internal/pb"
)

type common struct {
	addr, cert, key, ca string
	timeout             time.Duration
	maxSeconds          float64
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "", "server host:port (loopback)")
	fs.StringVar(&c.cert, "cert", "", "client certificate")
	fs.StringVar(&c.key, "key", "", "client key")
	fs.StringVar(&c.ca, "ca", "", "CA certificate the server's certificate chains to")
	fs.DurationVar(&c.timeout, "timeout", 60*time.Second, "timeout of each RPC (CA's grpc_timeout)")
	fs.Float64Var(&c.maxSeconds, "max-seconds", 300, "stop after this long whatever the count")
}

func (c *common) deadline() time.Time {
	return time.Now().Add(time.Duration(c.maxSeconds * float64(time.Second)))
}

// client is a CloudProvider stub with CA's per-RPC timeout.
type client struct {
	stub    pb.CloudProviderClient
	conn    *grpc.ClientConn
	timeout time.Duration
}

func dial(c *common) (*client, error) {
	tlsConfig, err := mtls.Client(c.addr, c.cert, c.key, c.ca)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(c.addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)))
	if err != nil {
		return nil, err
	}
	return &client{stub: pb.NewCloudProviderClient(conn), conn: conn, timeout: c.timeout}, nil
}

func (cl *client) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), cl.timeout)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchclient single|loop|refresh|increase [flags]")
		os.Exit(2)
	}
	modes := map[string]func([]string) (any, error){
		"single":   runSingle,
		"loop":     runLoop,
		"refresh":  runRefresh,
		"increase": runIncrease,
	}
	mode, ok := modes[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "benchclient: unknown mode %q (single, loop, refresh, increase)\n", os.Args[1])
		os.Exit(2)
	}
	result, err := mode(os.Args[2:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchclient:", err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(result); err != nil {
		fmt.Fprintln(os.Stderr, "benchclient:", err)
		os.Exit(1)
	}
}
