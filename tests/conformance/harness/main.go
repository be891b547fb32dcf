// Command harness drives a cloudscale-autoscaler gRPC server the way the Cluster Autoscaler's
// externalgrpc cloud provider does and checks what CA would see. It prints one line per check
// and exits 1 if any check failed (2 on bad usage).
//
// Build it with one of the version modules next to this directory, e.g.
//
//	cd tests/conformance/harness && go build -modfile ../ca-1.36.1/go.mod -o ../bin/ca-1.36.1 .
//
// The version module decides the CA generation (fields sent and read) and the versions of
// grpc-go, protobuf-go and k8s.io/api used: those of that CA release.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	cloudConfig := flag.String("cloud-config", "", "CA cloud-config file (address, cert, key, cacert, grpc_timeout)")
	expectPath := flag.String("expect", "", "expectations JSON written by the test")
	emulatorURL := flag.String("emulator", "", "emulator base URL (http://127.0.0.1:PORT[/v1])")
	release := flag.String("ca-release", "", "CA release to emulate (default: from the version module)")
	which := flag.String("scenario", "full", "full, or pricing (a server configured with prices)")
	flag.Parse()
	if *cloudConfig == "" || *expectPath == "" || *emulatorURL == "" {
		fmt.Fprintln(os.Stderr, "usage: harness -cloud-config FILE -expect FILE -emulator URL")
		os.Exit(2)
	}
	gen, err := lookupGeneration(*release)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	exp, err := readExpectations(*expectPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if *which != "full" && *which != "pricing" {
		fmt.Fprintf(os.Stderr, "unknown -scenario %q (full, pricing)\n", *which)
		os.Exit(2)
	}
	os.Exit(run(gen, exp, *cloudConfig, newEmulatorAdmin(*emulatorURL), *which))
}

func run(gen Generation, exp *expectations, cloudConfig string, admin *emulatorAdmin, which string) (code int) {
	r := &report{prefix: "[CA " + gen.Release + "]"}
	r.info("client: %s", clientKind)
	build := func(path string) (CloudProvider, error) { return buildProvider(path, gen) }
	defer func() {
		if v := recover(); v != nil {
			if a, ok := v.(errAbort); ok {
				r.info("scenario stopped: %s failed and later steps depend on it", a.name)
			} else {
				r.fail("panic", "%v", v)
			}
		}
		fmt.Printf("%s %d checks passed, %d failed\n", r.prefix, r.passed, r.failed)
		if r.failed > 0 {
			code = 1
		}
	}()
	cp, err := build(cloudConfig)
	r.mustNoErr("BuildExternalGrpc", err, "provider built from "+cloudConfig)
	s := &scenario{r: r, cp: cp, exp: exp, admin: admin, gen: gen, build: build}
	if which == "pricing" {
		s.runPricing()
	} else {
		s.run()
	}
	return 0
}
