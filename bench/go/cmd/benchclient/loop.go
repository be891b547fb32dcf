package main

import (
	"flag"
	"fmt"
	"time"

	pb "cloudscale-autoscaler/bench/internal/pb"
)

// Phases of one CA loop, in the order CA makes the calls; each phase's calls are sequential,
// as under CA's client mutex.
var phases = []string{"Refresh", "NodeGroups", "NodeGroupForNode", "TargetSize", "NodeGroupNodes",
	"TemplateNodeInfo", "GetOptions"}

// LoopResult is the CA loop repeated `loops` times.
type LoopResult struct {
	Nodes     int                `json:"nodes"`
	Managed   int                `json:"managed"`
	Groups    int                `json:"groups"`
	Instances int                `json:"instances"`
	RPCs      int                `json:"rpcs_per_loop"`
	Loop      Summary            `json:"loop"`
	Phases    map[string]Summary `json:"phases"`
}

type loopRun struct {
	cl       *client
	nodes    []*pb.ExternalGrpcNode
	defaults *pb.NodeGroupAutoscalingOptions
	phase    map[string]time.Duration
	result   *LoopResult
}

func runLoop(args []string) (any, error) {
	fs := flag.NewFlagSet("loop", flag.ExitOnError)
	var c common
	c.register(fs)
	nodesPath := fs.String("nodes", "", "nodes JSON: {\"nodes\": [{\"providerID\", \"name\"}]}")
	loops := fs.Int("loops", 3, "CA loops to run")
	_ = fs.Parse(args)
	refs, err := readNodes(*nodesPath)
	if err != nil {
		return nil, err
	}
	cl, err := dial(&c)
	if err != nil {
		return nil, err
	}
	defer cl.conn.Close()
	run := &loopRun{cl: cl, defaults: caDefaults(), result: &LoopResult{Nodes: len(refs)}}
	for _, ref := range refs {
		run.nodes = append(run.nodes, grpcNode(ref))
	}
	var totals []time.Duration
	perPhase := map[string][]time.Duration{}
	deadline := c.deadline()
	for i := 0; i < *loops && time.Now().Before(deadline); i++ {
		run.phase = map[string]time.Duration{}
		start := time.Now()
		if err := run.once(); err != nil {
			return nil, fmt.Errorf("loop %d: %w", i+1, err)
		}
		totals = append(totals, time.Since(start))
		for name, d := range run.phase {
			perPhase[name] = append(perPhase[name], d)
		}
	}
	run.result.Loop = summarize(totals)
	run.result.Phases = map[string]Summary{}
	for _, name := range phases {
		run.result.Phases[name] = summarize(perPhase[name])
	}
	return run.result, nil
}

// timed runs f as (part of) the named phase.
func (r *loopRun) timed(name string, f func() error) error {
	start := time.Now()
	err := f()
	r.phase[name] += time.Since(start)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// once is one CA loop: Refresh; NodeGroups; NodeGroupForNode for every node (cached by CA
// until the next Refresh, so once per node per loop); TargetSize and NodeGroupNodes per group;
// TemplateNodeInfo per group (cached until Refresh); GetOptions per managed node (never cached).
func (r *loopRun) once() error {
	rpcs := 0
	call := func(name string, f func() error) error {
		rpcs++
		return r.timed(name, f)
	}
	if err := call("Refresh", r.refresh); err != nil {
		return err
	}
	var groups []*pb.NodeGroup
	if err := call("NodeGroups", func() (err error) { groups, err = r.nodeGroups(); return }); err != nil {
		return err
	}
	groupOf := make([]string, len(r.nodes))
	managed := 0
	for i, node := range r.nodes {
		if err := call("NodeGroupForNode", func() (err error) { groupOf[i], err = r.forNode(node); return }); err != nil {
			return err
		}
		if groupOf[i] != "" {
			managed++
		}
	}
	instances := 0
	for _, g := range groups {
		if err := call("TargetSize", func() error { return r.targetSize(g.Id) }); err != nil {
			return err
		}
		if err := call("NodeGroupNodes", func() (err error) { n, err := r.instances(g.Id); instances += n; return err }); err != nil {
			return err
		}
	}
	for _, g := range groups {
		if err := call("TemplateNodeInfo", func() error { return r.template(g.Id) }); err != nil {
			return err
		}
	}
	for _, id := range groupOf {
		if id == "" {
			continue
		}
		if err := call("GetOptions", func() error { return r.options(id) }); err != nil {
			return err
		}
	}
	r.result.Managed, r.result.Groups, r.result.Instances, r.result.RPCs = managed, len(groups), instances, rpcs
	return nil
}

func (r *loopRun) refresh() error {
	ctx, cancel := r.cl.ctx()
	defer cancel()
	_, err := r.cl.stub.Refresh(ctx, &pb.RefreshRequest{})
	return err
}

func (r *loopRun) nodeGroups() ([]*pb.NodeGroup, error) {
	ctx, cancel := r.cl.ctx()
	defer cancel()
	res, err := r.cl.stub.NodeGroups(ctx, &pb.NodeGroupsRequest{})
	return res.GetNodeGroups(), err
}

func (r *loopRun) forNode(node *pb.ExternalGrpcNode) (string, error) {
	ctx, cancel := r.cl.ctx()
	defer cancel()
	res, err := r.cl.stub.NodeGroupForNode(ctx, &pb.NodeGroupForNodeRequest{Node: node})
	return res.GetNodeGroup().GetId(), err
}

func (r *loopRun) targetSize(id string) error {
	ctx, cancel := r.cl.ctx()
	defer cancel()
	_, err := r.cl.stub.NodeGroupTargetSize(ctx, &pb.NodeGroupTargetSizeRequest{Id: id})
	return err
}

func (r *loopRun) instances(id string) (int, error) {
	ctx, cancel := r.cl.ctx()
	defer cancel()
	res, err := r.cl.stub.NodeGroupNodes(ctx, &pb.NodeGroupNodesRequest{Id: id})
	return len(res.GetInstances()), err
}

func (r *loopRun) template(id string) error {
	ctx, cancel := r.cl.ctx()
	defer cancel()
	res, err := r.cl.stub.NodeGroupTemplateNodeInfo(ctx, &pb.NodeGroupTemplateNodeInfoRequest{Id: id})
	if err == nil && len(res.GetNodeBytes()) == 0 {
		err = fmt.Errorf("group %s: empty nodeBytes", id)
	}
	return err
}

func (r *loopRun) options(id string) error {
	ctx, cancel := r.cl.ctx()
	defer cancel()
	_, err := r.cl.stub.NodeGroupGetOptions(ctx, &pb.NodeGroupAutoscalingOptionsRequest{Id: id, Defaults: r.defaults})
	return err
}
