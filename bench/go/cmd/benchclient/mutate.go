package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"

	pb "cloudscale-autoscaler/bench/internal/pb"
)

// RefreshResult is Refresh called `calls` times in a row.
type RefreshResult struct {
	Latency Summary `json:"latency"`
}

func runRefresh(args []string) (any, error) {
	fs := flag.NewFlagSet("refresh", flag.ExitOnError)
	var c common
	c.register(fs)
	calls := fs.Int("calls", 5, "Refresh calls")
	_ = fs.Parse(args)
	cl, err := dial(&c)
	if err != nil {
		return nil, err
	}
	defer cl.conn.Close()
	var samples []time.Duration
	deadline := c.deadline()
	for i := 0; i < *calls && time.Now().Before(deadline); i++ {
		ctx, cancel := cl.ctx()
		start := time.Now()
		_, err := cl.stub.Refresh(ctx, &pb.RefreshRequest{})
		samples = append(samples, time.Since(start))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("Refresh %d: %w", i+1, err)
		}
	}
	return &RefreshResult{Latency: summarize(samples)}, nil
}

// IncreaseResult times one IncreaseSize: until the RPC returned, and until the emulator had
// answered `expect` more successful creates than before it.
type IncreaseResult struct {
	Delta      int     `json:"delta"`
	RPCSeconds float64 `json:"rpc_s"`
	RPCError   string  `json:"rpc_error"`
	AllSeconds float64 `json:"all_created_s"`
	Created    int     `json:"created"`
	TimedOut   bool    `json:"timed_out"`
}

func runIncrease(args []string) (any, error) {
	fs := flag.NewFlagSet("increase", flag.ExitOnError)
	var c common
	c.register(fs)
	group := fs.String("group", "", "node group id")
	delta := fs.Int("delta", 100, "IncreaseSize delta")
	emulator := fs.String("emulator", "", "emulator base URL http://127.0.0.1:PORT")
	poll := fs.Duration("poll", 50*time.Millisecond, "emulator stats polling interval")
	_ = fs.Parse(args)
	cl, err := dial(&c)
	if err != nil {
		return nil, err
	}
	defer cl.conn.Close()
	stats := strings.TrimSuffix(strings.TrimSuffix(*emulator, "/"), "/v1") + "/_emulator/stats"
	before, err := createdCount(stats)
	if err != nil {
		return nil, err
	}
	// Establish the connection (TLS handshake) first: CA's connection is long-lived.
	ctx, cancel := cl.ctx()
	_, err = cl.stub.NodeGroupTargetSize(ctx, &pb.NodeGroupTargetSizeRequest{Id: *group})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("TargetSize %s: %w", *group, err)
	}
	result := &IncreaseResult{Delta: *delta}
	deadline := c.deadline()
	start := time.Now()
	ctx, cancel = cl.ctx()
	_, err = cl.stub.NodeGroupIncreaseSize(ctx, &pb.NodeGroupIncreaseSizeRequest{Id: *group, Delta: int32(*delta)})
	cancel()
	result.RPCSeconds = time.Since(start).Seconds()
	if err != nil {
		result.RPCError = err.Error()
	}
	for {
		now, err := createdCount(stats)
		if err != nil {
			return nil, err
		}
		result.Created = now - before
		if result.Created >= *delta {
			result.AllSeconds = time.Since(start).Seconds()
			return result, nil
		}
		if time.Now().After(deadline) {
			result.TimedOut = true
			return result, nil
		}
		time.Sleep(*poll)
	}
}

// createdCount is how many server creates the emulator has answered 201.
func createdCount(statsURL string) (int, error) {
	res, err := http.Get(statsURL)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var body struct {
		Requests map[string]map[string]int `json:"requests"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("%s: %w", statsURL, err)
	}
	return body.Requests["create_server"]["201"], nil
}
