package main

// A client with the behaviour of CA's externalgrpc cloud provider for one CA generation:
// one timeout per RPC, the same caches (NodeGroups / NodeGroupForNode until Refresh, templates
// per group object, GPU label and types forever), the same error mapping (only Unimplemented
// means something, and only for TemplateNodeInfo, GetOptions and pricing), and the same
// fields sent and read. k8s objects are encoded and decoded by k8s.io/api itself, at the
// version that CA release uses.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const servicePrefix = "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/"

type rpc struct {
	conn    *grpc.ClientConn
	timeout time.Duration
	gen     Generation
}

// call sends an encoded request and parses the answer as `method`Response.
func (r *rpc) call(method string, req []byte) (msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	var out []byte
	err := r.conn.Invoke(ctx, servicePrefix+method, &req, &out, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return msg{}, err
	}
	return parseMsg(method+"Response", out)
}

func isUnimplemented(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unimplemented
}

// buildProvider is the harness's BuildExternalGrpc: cloud-config file in, provider out.
func buildProvider(cloudConfigPath string, gen Generation) (CloudProvider, error) {
	cfg, err := readCloudConfig(cloudConfigPath)
	if err != nil {
		return nil, err
	}
	conn, err := cfg.dial()
	if err != nil {
		return nil, err
	}
	return &wireProvider{
		rpc:          &rpc{conn: conn, timeout: cfg.timeout(), gen: gen},
		forNodeCache: map[string]NodeGroup{},
	}, nil
}

type wireProvider struct {
	*rpc
	mu              sync.Mutex
	nodeGroupsCache []NodeGroup
	forNodeCache    map[string]NodeGroup
	gpuLabelCache   *string
	gpuTypesCache   map[string]struct{}
}

func (p *wireProvider) Refresh() error {
	p.mu.Lock()
	p.forNodeCache = map[string]NodeGroup{}
	p.nodeGroupsCache = nil
	p.mu.Unlock()
	_, err := p.call("Refresh", nil)
	return err
}

func (p *wireProvider) newGroup(m msg) *wireNodeGroup {
	return &wireNodeGroup{
		rpc:     p.rpc,
		id:      m.str(1, "id"),
		minSize: int(m.int32(2, "minSize")),
		maxSize: int(m.int32(3, "maxSize")),
		debug:   m.str(4, "debug"),
	}
}

// NodeGroups returns an empty list on error, as CA does (it only logs the error).
func (p *wireProvider) NodeGroups() []NodeGroup {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nodeGroupsCache != nil {
		return p.nodeGroupsCache
	}
	groups := []NodeGroup{}
	res, err := p.call("NodeGroups", nil)
	if err != nil {
		return groups
	}
	items, err := res.repeated(1, "nodeGroups")
	if err != nil {
		return groups
	}
	for _, item := range items {
		groups = append(groups, p.newGroup(item))
	}
	p.nodeGroupsCache = groups
	return groups
}

// externalNode is CA's externalGrpcNode(): only providerID, name, labels and annotations.
func externalNode(node *apiv1.Node) []byte {
	var e enc
	e.str(1, node.Spec.ProviderID)
	e.str(2, node.Name)
	e.strMap(3, node.Labels)
	e.strMap(4, node.Annotations)
	return e.b
}

func (p *wireProvider) NodeGroupForNode(node *apiv1.Node) (NodeGroup, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if node == nil {
		return nil, fmt.Errorf("node in NodeGroupForNode call cannot be nil")
	}
	key := node.Name + node.Spec.ProviderID
	if ng, ok := p.forNodeCache[key]; ok {
		return ng, nil
	}
	var req enc
	req.message(1, externalNode(node))
	res, err := p.call("NodeGroupForNode", req.b)
	if err != nil {
		return nil, err
	}
	ngMsg, _, err := res.sub(1, "nodeGroup")
	if err != nil {
		return nil, err
	}
	if ngMsg.str(1, "id") == "" {
		return nil, nil // not managed by this provider; CA does not cache this answer
	}
	ng := p.newGroup(ngMsg)
	p.forNodeCache[key] = ng
	return ng, nil
}

func (p *wireProvider) GPULabel() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gpuLabelCache != nil {
		return *p.gpuLabelCache
	}
	res, err := p.call("GPULabel", nil)
	if err != nil {
		return ""
	}
	label := res.str(1, "label")
	p.gpuLabelCache = &label
	return label
}

func (p *wireProvider) GetAvailableGPUTypes() map[string]struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gpuTypesCache != nil {
		return p.gpuTypesCache
	}
	res, err := p.call("GetAvailableGPUTypes", nil)
	if err != nil {
		return nil
	}
	keys, err := res.mapKeys(1, "gpuTypes")
	if err != nil {
		return nil
	}
	types := map[string]struct{}{}
	for _, k := range keys {
		types[k] = struct{}{}
	}
	p.gpuTypesCache = types
	return types
}

func k8sTime(t time.Time) []byte {
	mt := metav1.NewTime(t)
	b, err := mt.Marshal()
	if err != nil {
		panic(err) // marshalling a valid time cannot fail
	}
	return b
}

func timestamp(t time.Time) []byte {
	b, err := proto.Marshal(timestamppb.New(t))
	if err != nil {
		panic(err)
	}
	return b
}

func (p *wireProvider) price(method string, req []byte) (float64, error) {
	res, err := p.call(method, req)
	if err != nil {
		if isUnimplemented(err) {
			return 0, ErrNotImplemented
		}
		return 0, err
	}
	return res.double(1, "price"), nil
}

func (p *wireProvider) NodePrice(node *apiv1.Node, start, end time.Time) (float64, error) {
	var req enc
	req.message(1, externalNode(node))
	if p.gen.OldPricing {
		req.message(2, k8sTime(start))
		req.message(3, k8sTime(end))
	}
	if p.gen.NewPricing {
		req.message(4, timestamp(start))
		req.message(5, timestamp(end))
	}
	return p.price("PricingNodePrice", req.b)
}

func (p *wireProvider) PodPrice(pod *apiv1.Pod, start, end time.Time) (float64, error) {
	podBytes, err := pod.Marshal()
	if err != nil {
		return 0, err
	}
	var req enc
	if p.gen.OldPricing {
		req.message(1, podBytes)
		req.message(2, k8sTime(start))
		req.message(3, k8sTime(end))
	}
	if p.gen.NewPricing {
		req.bytes(4, podBytes)
		req.message(5, timestamp(start))
		req.message(6, timestamp(end))
	}
	return p.price("PricingPodPrice", req.b)
}

func (p *wireProvider) Cleanup() error {
	_, err := p.call("Cleanup", nil)
	return err
}

// clientKind names the client behind the interfaces in the harness output.
const clientKind = "wire-level CA externalgrpc client (k8s.io/api, grpc-go and protobuf-go at this release's versions)"
