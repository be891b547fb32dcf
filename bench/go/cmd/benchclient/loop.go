package main

import (
	"flag"
	"fmt"
	"time"

	pb "cloudscale-autoscaler/bench/internal/pb"
)

// Phases of one CA loop, one per RPC, in the order CA first makes each call; every call is
// sequential, as under CA's client mutex.
var phases = []string{"Refresh", "NodeGroups", "NodeGroupForNode", "TemplateNodeInfo",
	"TargetSize", "GetOptions"}

// pattern is what one idle CA loop sends besides one Refresh and one NodeGroups (both cached by
// CA's client until the next Refresh). bench/README.md says where each count comes from.
type pattern struct {
	// NodeGroupForNode lookups per loop of a node that is not ours: CA's client caches only
	// non-empty answers, so a node of ours costs one call per loop and any other node one call
	// at every lookup site.
	staticLookups int
	// GetOptions calls per node of ours and loop (never cached by CA's client).
	optionsPerNode int
	// TargetSize calls per group and loop (never cached).
	targetSizesPerGroup int
	// TemplateNodeInfo calls per loop, for the first groups (cached until the next Refresh).
	templates int
}

func (p *pattern) register(fs *flag.FlagSet) {
	fs.IntVar(&p.staticLookups, "static-lookups", 1, "NodeGroupForNode calls per loop for a node that is not ours")
	fs.IntVar(&p.optionsPerNode, "options-per-node", 0, "GetOptions calls per node of ours per loop")
	fs.IntVar(&p.targetSizesPerGroup, "target-sizes-per-group", 1, "TargetSize calls per group per loop")
	fs.IntVar(&p.templates, "templates", 1, "TemplateNodeInfo calls per loop (first groups)")
}

// LoopResult is the CA loop repeated `loops` times.
type LoopResult struct {
	Nodes   int                `json:"nodes"`
	Managed int                `json:"managed"`
	Groups  int                `json:"groups"`
	RPCs    int                `json:"rpcs_per_loop"`
	Calls   map[string]int     `json:"calls_per_loop"`
	Loop    Summary            `json:"loop"`
	Phases  map[string]Summary `json:"phases"`
}

type loopRun struct {
	cl       *client
	pattern  pattern
	nodes    []*pb.ExternalGrpcNode
	defaults *pb.NodeGroupAutoscalingOptions
	phase    map[string]time.Duration
	calls    map[string]int
	result   *LoopResult
}

func runLoop(args []string) (any, error) {
	fs := flag.NewFlagSet("loop", flag.ExitOnError)
	var c common
	c.register(fs)
	var p pattern
	p.register(fs)
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
	run := &loopRun{cl: cl, pattern: p, defaults: caDefaults(), result: &LoopResult{Nodes: len(refs)}}
	for _, ref := range refs {
		run.nodes = append(run.nodes, grpcNode(ref))
	}
	var totals []time.Duration
	perPhase := map[string][]time.Duration{}
	deadline := c.deadline()
	for i := 0; i < *loops && time.Now().Before(deadline); i++ {
		run.phase, run.calls = map[string]time.Duration{}, map[string]int{}
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

// call makes one RPC as part of its phase, counting it.
func (r *loopRun) call(name string, f func() error) error {
	start := time.Now()
	err := f()
	r.phase[name] += time.Since(start)
	r.calls[name]++
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// once is one idle CA loop: Refresh and NodeGroups; the first NodeGroupForNode of every node
// (building templates); TemplateNodeInfo; TargetSize per group; then per node the readiness
// accounting's GetOptions (ours) and the further lookups of nodes that are not ours.
func (r *loopRun) once() error {
	if err := r.call("Refresh", r.refresh); err != nil {
		return err
	}
	var groups []*pb.NodeGroup
	if err := r.call("NodeGroups", func() (err error) { groups, err = r.nodeGroups(); return }); err != nil {
		return err
	}
	groupOf := make([]string, len(r.nodes))
	for i, node := range r.nodes {
		if err := r.call("NodeGroupForNode", func() (err error) { groupOf[i], err = r.forNode(node); return }); err != nil {
			return err
		}
	}
	for _, g := range groups[:min(r.pattern.templates, len(groups))] {
		if err := r.call("TemplateNodeInfo", func() error { return r.template(g.Id) }); err != nil {
			return err
		}
	}
	for _, g := range groups {
		for k := 0; k < r.pattern.targetSizesPerGroup; k++ {
			if err := r.call("TargetSize", func() error { return r.targetSize(g.Id) }); err != nil {
				return err
			}
		}
	}
	managed := 0
	for i, id := range groupOf {
		if err := r.rest(r.nodes[i], id); err != nil {
			return err
		}
		if id != "" {
			managed++
		}
	}
	r.result.Managed, r.result.Groups = managed, len(groups)
	r.result.Calls, r.result.RPCs = map[string]int{}, 0
	for _, name := range phases {
		r.result.Calls[name] = r.calls[name]
		r.result.RPCs += r.calls[name]
	}
	return nil
}

// rest is a node's calls after its first lookup: GetOptions for a node of ours, the lookups
// CA repeats for a node that is not (its empty answer is never cached).
func (r *loopRun) rest(node *pb.ExternalGrpcNode, id string) error {
	if id != "" {
		for k := 0; k < r.pattern.optionsPerNode; k++ {
			if err := r.call("GetOptions", func() error { return r.options(id) }); err != nil {
				return err
			}
		}
		return nil
	}
	for k := 1; k < r.pattern.staticLookups; k++ {
		if err := r.call("NodeGroupForNode", func() (err error) { _, err = r.forNode(node); return }); err != nil {
			return err
		}
	}
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
