package main

import (
	"flag"
	"fmt"
	"time"

	pb "cloudscale-autoscaler/bench/internal/pb"
)

// SingleResult is the outcome of one RPC called `calls` times in a row.
type SingleResult struct {
	RPC     string  `json:"rpc"`
	Warmup  int     `json:"warmup"`
	Errors  int     `json:"errors"`
	Latency Summary `json:"latency"`
	// Answer describes the last response, so the caller can check it hit the intended path.
	Answer string `json:"answer"`
}

func runSingle(args []string) (any, error) {
	fs := flag.NewFlagSet("single", flag.ExitOnError)
	var c common
	c.register(fs)
	rpcName := fs.String("rpc", "", "NodeGroupForNode, TargetSize, GetOptions, TemplateNodeInfo, IncreaseSize or DeleteNodes")
	providerID := fs.String("provider-id", "", "NodeGroupForNode: the node's providerID")
	group := fs.String("group", "", "every RPC but NodeGroupForNode: the node group id")
	nodesPath := fs.String("nodes", "", "DeleteNodes: nodes JSON, one node of the group deleted per call")
	calls := fs.Int("calls", 2000, "measured calls")
	warmup := fs.Int("warmup", 200, "calls made first and not measured")
	_ = fs.Parse(args)
	cl, err := dial(&c)
	if err != nil {
		return nil, err
	}
	defer cl.conn.Close()
	var victims []NodeRef
	if *rpcName == "DeleteNodes" {
		if victims, err = readNodes(*nodesPath); err != nil {
			return nil, err
		}
		if len(victims) < *warmup+*calls {
			return nil, fmt.Errorf("-nodes %s: %d nodes, DeleteNodes needs %d", *nodesPath, len(victims), *warmup+*calls)
		}
	}
	call, err := singleCall(cl, *rpcName, *providerID, *group, victims)
	if err != nil {
		return nil, err
	}
	result := &SingleResult{RPC: *rpcName, Warmup: *warmup}
	deadline := c.deadline()
	for i := 0; i < *warmup && time.Now().Before(deadline); i++ {
		if _, err := call(); err != nil {
			return nil, fmt.Errorf("%s (warm-up): %w", *rpcName, err)
		}
	}
	samples := make([]time.Duration, 0, *calls)
	for i := 0; i < *calls && time.Now().Before(deadline); i++ {
		start := time.Now()
		answer, err := call()
		samples = append(samples, time.Since(start))
		if err != nil {
			result.Errors++
			result.Answer = err.Error()
			continue
		}
		result.Answer = answer
	}
	result.Latency = summarize(samples)
	return result, nil
}

// singleCall returns a function making one call of the RPC and describing the answer.
func singleCall(cl *client, rpcName, providerID, group string, victims []NodeRef) (func() (string, error), error) {
	switch rpcName {
	case "NodeGroupForNode":
		req := &pb.NodeGroupForNodeRequest{Node: grpcNode(NodeRef{ProviderID: providerID, Name: "bench-node"})}
		return func() (string, error) {
			ctx, cancel := cl.ctx()
			defer cancel()
			res, err := cl.stub.NodeGroupForNode(ctx, req)
			return "group=" + res.GetNodeGroup().GetId(), err
		}, nil
	case "TargetSize":
		req := &pb.NodeGroupTargetSizeRequest{Id: group}
		return func() (string, error) {
			ctx, cancel := cl.ctx()
			defer cancel()
			res, err := cl.stub.NodeGroupTargetSize(ctx, req)
			return fmt.Sprintf("targetSize=%d", res.GetTargetSize()), err
		}, nil
	case "GetOptions":
		req := &pb.NodeGroupAutoscalingOptionsRequest{Id: group, Defaults: caDefaults()}
		return func() (string, error) {
			ctx, cancel := cl.ctx()
			defer cancel()
			res, err := cl.stub.NodeGroupGetOptions(ctx, req)
			opts := res.GetNodeGroupAutoscalingOptions()
			return fmt.Sprintf("scaleDownUtilizationThreshold=%g", opts.GetScaleDownUtilizationThreshold()), err
		}, nil
	case "TemplateNodeInfo":
		req := &pb.NodeGroupTemplateNodeInfoRequest{Id: group}
		return func() (string, error) {
			ctx, cancel := cl.ctx()
			defer cancel()
			res, err := cl.stub.NodeGroupTemplateNodeInfo(ctx, req)
			return fmt.Sprintf("nodeBytes=%t", len(res.GetNodeBytes()) > 0), err
		}, nil
	}
	return forwardedCall(cl, rpcName, group, victims)
}

// forwardedCall is singleCall for the RPCs that change state.
func forwardedCall(cl *client, rpcName, group string, victims []NodeRef) (func() (string, error), error) {
	switch rpcName {
	case "IncreaseSize":
		req := &pb.NodeGroupIncreaseSizeRequest{Id: group, Delta: 1}
		return func() (string, error) {
			ctx, cancel := cl.ctx()
			defer cancel()
			_, err := cl.stub.NodeGroupIncreaseSize(ctx, req)
			return "ok", err
		}, nil
	case "DeleteNodes":
		next := 0
		return func() (string, error) {
			node := grpcNode(victims[next])
			next++
			ctx, cancel := cl.ctx()
			defer cancel()
			_, err := cl.stub.NodeGroupDeleteNodes(ctx, &pb.NodeGroupDeleteNodesRequest{Id: group, Nodes: []*pb.ExternalGrpcNode{node}})
			return "ok", err
		}, nil
	}
	return nil, fmt.Errorf("-rpc %q: expected NodeGroupForNode, TargetSize, GetOptions, TemplateNodeInfo, IncreaseSize or DeleteNodes", rpcName)
}
