package main

// The scenario: drive the provider through the calls CA's core makes, in CA's order, and
// check what the CA client returns.

import (
	"crypto/rand"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	providerPrefix = "cloudscale://"
	tagCluster     = "k8s-cluster"
	tagGroup       = "k8s-autoscaler-group"
	pollTimeout    = 20 * time.Second
)

var providerIDPattern = regexp.MustCompile(`^cloudscale://[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

type scenario struct {
	r     *report
	cp    CloudProvider
	exp   *expectations
	admin *emulatorAdmin
	gen   Generation
	build func(path string) (CloudProvider, error)

	groups map[string]NodeGroup
	own    cloudServer // a server of the scale group that existed before the scenario
	// foreignServers are in the same cloud project but not ours (other cluster, untagged).
	foreignServers []cloudServer
}

func randomUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func nodeFor(name, providerID string) *apiv1.Node {
	return &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       apiv1.NodeSpec{ProviderID: providerID},
	}
}

// poll calls f until it reports done or the timeout passes; it returns f's last detail.
func poll(timeout time.Duration, f func() (bool, string)) (bool, string) {
	deadline := time.Now().Add(timeout)
	for {
		done, detail := f()
		if done || time.Now().After(deadline) {
			return done, detail
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *scenario) run() {
	s.checkRejectedConnections()
	s.seed()
	s.r.mustNoErr("Refresh", s.cp.Refresh(), "ok")
	s.checkNodeGroups()
	s.checkNodeGroupForNode()
	s.checkTemplates()
	s.checkScaling()
	s.checkOptions()
	s.checkGPU()
	s.checkPricing()
	s.checkRefreshAgain()
	s.r.noErr("Cleanup", s.cp.Cleanup(), "ok")
	s.checkWire()
}

// TLS: a client that trusts another CA, or presents a certificate of another CA, must not
// get any answer. CA dials lazily, so the failure shows on the first RPC (Refresh).
func (s *scenario) checkRejectedConnections() {
	for _, rc := range s.exp.RejectedCloudConfigs {
		name := "tls.rejected[" + rc.Name + "]"
		p, err := s.build(rc.Path)
		if err != nil {
			s.r.pass(name, "client could not even be built: %v", err)
			continue
		}
		err = p.Refresh()
		s.r.check(name+".Refresh", err != nil, "Refresh must fail, got err=%v", err)
		groups := p.NodeGroups()
		s.r.check(name+".NodeGroups", len(groups) == 0, "CA sees no groups, got %d", len(groups))
	}
}

// seed puts servers into the emulator: one of our scale group, one of another cluster and
// an untagged one (say, a control-plane node in the same project).
func (s *scenario) seed() {
	g := s.exp.group(s.exp.ScaleGroup)
	create := func(name string, tags map[string]string) cloudServer {
		body := map[string]any{
			"name": name, "flavor": g.Flavor, "image": s.exp.Image, "tags": tags,
			"status": "running",
		}
		if g.Zone != "" {
			body["zone"] = g.Zone
		}
		srv, err := s.admin.createServer(body)
		s.r.mustNoErr("seed["+name+"]", err, "created "+srv.UUID)
		return srv
	}
	s.own = create(s.exp.Cluster+"-"+g.ID+"-seeded",
		map[string]string{tagCluster: s.exp.Cluster, tagGroup: g.ID})
	foreign := create("other-cluster-node", map[string]string{tagCluster: "other-" + s.exp.Cluster, tagGroup: g.ID})
	plain := create("control-plane-1", map[string]string{})
	s.foreignServers = []cloudServer{foreign, plain}
}

func (s *scenario) checkNodeGroups() {
	s.groups = map[string]NodeGroup{}
	var ids []string
	for _, ng := range s.cp.NodeGroups() {
		s.groups[ng.Id()] = ng
		ids = append(ids, ng.Id())
	}
	sort.Strings(ids)
	var want []string
	for _, g := range s.exp.Groups {
		want = append(want, g.ID)
	}
	sort.Strings(want)
	s.r.require("NodeGroups.ids", strings.Join(ids, ",") == strings.Join(want, ","),
		"want %v, got %v", want, ids)
	for _, g := range s.exp.Groups {
		ng := s.groups[g.ID]
		s.r.check("NodeGroups["+g.ID+"].size", ng.MinSize() == g.MinSize && ng.MaxSize() == g.MaxSize,
			"want min %d max %d, got min %d max %d", g.MinSize, g.MaxSize, ng.MinSize(), ng.MaxSize())
	}
}

func (s *scenario) expectNoGroup(name string, node *apiv1.Node) {
	ng, err := s.cp.NodeGroupForNode(node)
	switch {
	case err != nil:
		s.r.fail(name, "want no group, got error (costs an RPC for this node every loop): %v", err)
	case ng != nil:
		s.r.fail(name, "want no group, got %q", ng.Id())
	default:
		s.r.pass(name, "not managed (nil group, no error)")
	}
}

func (s *scenario) checkNodeGroupForNode() {
	g := s.exp.group(s.exp.ScaleGroup)
	ng, err := s.cp.NodeGroupForNode(nodeFor(s.own.Name, providerPrefix+s.own.UUID))
	if s.r.noErr("NodeGroupForNode.own.err", err, "ok") {
		ok := ng != nil && ng.Id() == g.ID && ng.MinSize() == g.MinSize && ng.MaxSize() == g.MaxSize
		detail := "nil"
		if ng != nil {
			detail = fmt.Sprintf("%q min %d max %d", ng.Id(), ng.MinSize(), ng.MaxSize())
		}
		s.r.check("NodeGroupForNode.own", ok, "want %q min %d max %d, got %s", g.ID, g.MinSize, g.MaxSize, detail)
	}
	s.expectNoGroup("NodeGroupForNode.foreignProvider",
		nodeFor("ip-10-0-0-1.ec2.internal", "aws:///eu-central-1a/i-0123456789abcdef0"))
	s.expectNoGroup("NodeGroupForNode.emptyProviderID", nodeFor("kind-worker", ""))
	s.expectNoGroup("NodeGroupForNode.unknownUUID", nodeFor("stranger", providerPrefix+randomUUID()))
	for _, srv := range s.foreignServers {
		s.expectNoGroup("NodeGroupForNode.notOurs["+srv.Name+"]", nodeFor(srv.Name, providerPrefix+srv.UUID))
	}
}

func (s *scenario) checkTemplates() {
	for _, g := range s.exp.Groups {
		node, err := s.groups[g.ID].TemplateNode()
		if !s.r.noErr("TemplateNodeInfo["+g.ID+"]", err, "ok") {
			continue
		}
		gcopy := g
		checkTemplate(s.r, &gcopy, node, s.exp.GPULabel)
	}
}

func optionsDiff(want, got Options) []string {
	var d []string
	add := func(name string, w, g any) {
		if w != g {
			d = append(d, fmt.Sprintf("%s: want %v, got %v", name, w, g))
		}
	}
	add("scaleDownUtilizationThreshold", want.ScaleDownUtilizationThreshold, got.ScaleDownUtilizationThreshold)
	add("scaleDownGpuUtilizationThreshold", want.ScaleDownGpuUtilizationThreshold, got.ScaleDownGpuUtilizationThreshold)
	add("scaleDownUnneededTime", want.ScaleDownUnneededTime, got.ScaleDownUnneededTime)
	add("scaleDownUnreadyTime", want.ScaleDownUnreadyTime, got.ScaleDownUnreadyTime)
	add("maxNodeProvisionTime", want.MaxNodeProvisionTime, got.MaxNodeProvisionTime)
	add("zeroOrMaxNodeScaling", want.ZeroOrMaxNodeScaling, got.ZeroOrMaxNodeScaling)
	add("ignoreDaemonSetsUtilization", want.IgnoreDaemonSetsUtilization, got.IgnoreDaemonSetsUtilization)
	return d
}

func (s *scenario) checkOptions() {
	defaults := s.exp.Defaults.options()
	for _, g := range s.exp.Groups {
		name := "GetOptions[" + g.ID + "]"
		got, err := s.groups[g.ID].GetOptions(defaults)
		if g.Options == nil {
			s.r.check(name, errors.Is(err, ErrNotImplemented),
				"no overrides: want ErrNotImplemented (CA uses its defaults), got %+v, err=%v", got, err)
			continue
		}
		if !s.r.noErr(name+".err", err, "ok") {
			continue
		}
		if !s.r.check(name+".present", got != nil, "options returned") {
			continue
		}
		d := optionsDiff(g.Options.options(), *got)
		s.r.check(name, len(d) == 0, "CA %s sees the overrides with defaults filled in; differences: %v",
			s.gen.Release, d)
	}
}

func (s *scenario) checkGPU() {
	label := s.cp.GPULabel()
	s.r.check("GPULabel", label == s.exp.GPULabel, "want %q, got %q", s.exp.GPULabel, label)
	types := s.cp.GetAvailableGPUTypes()
	var got []string
	for t := range types {
		got = append(got, t)
	}
	sort.Strings(got)
	if !s.r.check("GetAvailableGPUTypes", types != nil, "RPC answered; types %v", got) {
		return
	}
	if s.exp.GPUTypes != nil {
		want := append([]string(nil), s.exp.GPUTypes...)
		sort.Strings(want)
		s.r.check("GetAvailableGPUTypes.set", strings.Join(got, ",") == strings.Join(want, ","),
			"want %v, got %v", want, got)
	}
}

func (s *scenario) checkPricing() {
	start := time.Now()
	end := start.Add(time.Hour)
	node := nodeFor(s.own.Name, providerPrefix+s.own.UUID)
	price, err := s.cp.NodePrice(node, start, end)
	s.r.check("Pricing.NodePrice", errors.Is(err, ErrNotImplemented),
		"want ErrNotImplemented (price expander skips us), got price %v err=%v", price, err)
	pod := stabilizationPod()
	price, err = s.cp.PodPrice(pod, start, end)
	s.r.check("Pricing.PodPrice", errors.Is(err, ErrNotImplemented),
		"want ErrNotImplemented, got price %v err=%v", price, err)
}

func (s *scenario) checkRefreshAgain() {
	if !s.r.noErr("Refresh.again", s.cp.Refresh(), "ok") {
		return
	}
	ng, err := s.cp.NodeGroupForNode(nodeFor(s.own.Name, providerPrefix+s.own.UUID))
	s.r.check("NodeGroupForNode.afterRefresh", err == nil && ng != nil && ng.Id() == s.exp.ScaleGroup,
		"want %q, got %v err=%v", s.exp.ScaleGroup, ng, err)
}

func (s *scenario) checkWire() {
	found := takeAnomalies()
	s.r.check("wire.anomalies", len(found) == 0, "fields with an unexpected wire type: %v", found)
	for _, u := range unknownFields() {
		s.r.info("our server sends %s, which no released CA generation defines (CA ignores it)", u)
	}
}
