// Command goref is the benchmark's Go reference server: the externalgrpc CloudProvider service
// answering NodeGroupForNode, NodeGroupTargetSize and NodeGroupGetOptions from in-memory maps,
// and what else an idle CA loop asks (Refresh: nothing to do; NodeGroups; TemplateNodeInfo: a
// minimal template node per group, serialized once), over the same mTLS setup as
// cloudscale-autoscaler. Every other RPC answers Unimplemented. It is what a minimal, fast
// provider costs per call and per CA loop: the Python server's figures are ratios to it.
//
//	goref -listen 127.0.0.1:PORT -state state.json -cert server.crt -key server.key -ca ca.crt
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"cloudscale-autoscaler/bench/internal/mtls"
	pb "cloudscale-autoscaler/bench/internal/pb"
	corev1 "cloudscale-autoscaler/bench/internal/pb/k8s/corev1"
	metav1 "cloudscale-autoscaler/bench/internal/pb/k8s/metav1"
	"cloudscale-autoscaler/bench/internal/pb/k8s/resource"
)

// Options are a group's autoscalingOptions overrides; nil fields come from CA's defaults.
// Durations are in seconds.
type Options struct {
	ScaleDownUtilizationThreshold    *float64 `json:"scaleDownUtilizationThreshold"`
	ScaleDownGpuUtilizationThreshold *float64 `json:"scaleDownGpuUtilizationThreshold"`
	ScaleDownUnneededTime            *float64 `json:"scaleDownUnneededTime"`
	ScaleDownUnreadyTime             *float64 `json:"scaleDownUnreadyTime"`
	MaxNodeProvisionTime             *float64 `json:"maxNodeProvisionTime"`
	ZeroOrMaxNodeScaling             *bool    `json:"zeroOrMaxNodeScaling"`
	IgnoreDaemonSetsUtilization      *bool    `json:"ignoreDaemonSetsUtilization"`
}

// Group is one node group of the state file.
type Group struct {
	ID         string   `json:"id"`
	MinSize    int32    `json:"minSize"`
	MaxSize    int32    `json:"maxSize"`
	TargetSize int32    `json:"targetSize"`
	Options    *Options `json:"options"`
}

// State is what the benchmark writes for goref: the groups and which providerID is in which.
type State struct {
	Groups []Group           `json:"groups"`
	Nodes  map[string]string `json:"nodes"`
}

type server struct {
	pb.UnimplementedCloudProviderServer
	groups    map[string]*Group
	forNode   map[string]*pb.NodeGroupForNodeResponse
	list      *pb.NodeGroupsResponse
	templates map[string]*pb.NodeGroupTemplateNodeInfoResponse
}

var notManaged = &pb.NodeGroupForNodeResponse{NodeGroup: &pb.NodeGroup{}}

func newServer(state *State) (*server, error) {
	s := &server{
		groups:    map[string]*Group{},
		forNode:   map[string]*pb.NodeGroupForNodeResponse{},
		list:      &pb.NodeGroupsResponse{},
		templates: map[string]*pb.NodeGroupTemplateNodeInfoResponse{},
	}
	answers := map[string]*pb.NodeGroupForNodeResponse{}
	for i := range state.Groups {
		g := &state.Groups[i]
		s.groups[g.ID] = g
		group := &pb.NodeGroup{Id: g.ID, MinSize: g.MinSize, MaxSize: g.MaxSize}
		answers[g.ID] = &pb.NodeGroupForNodeResponse{NodeGroup: group}
		s.list.NodeGroups = append(s.list.NodeGroups, group)
		template, err := templateAnswer(g.ID)
		if err != nil {
			return nil, err
		}
		s.templates[g.ID] = template
	}
	for providerID, group := range state.Nodes {
		answer, ok := answers[group]
		if !ok {
			return nil, fmt.Errorf("nodes[%q]: group %q is not in groups", providerID, group)
		}
		s.forNode[providerID] = answer
	}
	return s, nil
}

// templateAnswer is a minimal template node for the group, in both generations of the field.
func templateAnswer(id string) (*pb.NodeGroupTemplateNodeInfoResponse, error) {
	quantities := map[string]*resource.Quantity{
		"cpu":    {String_: proto.String("3950m")},
		"memory": {String_: proto.String("3500Mi")},
		"pods":   {String_: proto.String("110")},
	}
	node := &corev1.Node{
		Metadata: &metav1.ObjectMeta{
			Name:   proto.String("template-" + id),
			Labels: map[string]string{"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"},
		},
		Status: &corev1.NodeStatus{Capacity: quantities, Allocatable: quantities},
	}
	nodeBytes, err := proto.Marshal(node)
	if err != nil {
		return nil, fmt.Errorf("template of %s: %w", id, err)
	}
	return &pb.NodeGroupTemplateNodeInfoResponse{NodeInfo: node, NodeBytes: nodeBytes}, nil
}

func (s *server) Refresh(context.Context, *pb.RefreshRequest) (*pb.RefreshResponse, error) {
	return &pb.RefreshResponse{}, nil
}

func (s *server) NodeGroups(context.Context, *pb.NodeGroupsRequest) (*pb.NodeGroupsResponse, error) {
	return s.list, nil
}

func (s *server) NodeGroupTemplateNodeInfo(_ context.Context, req *pb.NodeGroupTemplateNodeInfoRequest) (*pb.NodeGroupTemplateNodeInfoResponse, error) {
	answer, ok := s.templates[req.GetId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "node group %q is not configured", req.GetId())
	}
	return answer, nil
}

func (s *server) NodeGroupForNode(_ context.Context, req *pb.NodeGroupForNodeRequest) (*pb.NodeGroupForNodeResponse, error) {
	if answer, ok := s.forNode[req.GetNode().GetProviderID()]; ok {
		return answer, nil
	}
	// Other spellings of a cloudscale providerID, as the Python server accepts them.
	id := strings.ToLower(req.GetNode().GetProviderID())
	if answer, ok := s.forNode[id]; ok {
		return answer, nil
	}
	return notManaged, nil
}

func (s *server) NodeGroupTargetSize(_ context.Context, req *pb.NodeGroupTargetSizeRequest) (*pb.NodeGroupTargetSizeResponse, error) {
	g, err := s.group(req.GetId())
	if err != nil {
		return nil, err
	}
	return &pb.NodeGroupTargetSizeResponse{TargetSize: g.TargetSize}, nil
}

func (s *server) NodeGroupGetOptions(_ context.Context, req *pb.NodeGroupAutoscalingOptionsRequest) (*pb.NodeGroupAutoscalingOptionsResponse, error) {
	g, err := s.group(req.GetId())
	if err != nil {
		return nil, err
	}
	if g.Options == nil {
		return nil, status.Error(codes.Unimplemented, "node group has no autoscalingOptions")
	}
	return &pb.NodeGroupAutoscalingOptionsResponse{
		NodeGroupAutoscalingOptions: merge(g.Options, req.GetDefaults()),
	}, nil
}

func (s *server) group(id string) (*Group, error) {
	g, ok := s.groups[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "node group %q is not configured", id)
	}
	return g, nil
}

// merge fills every field, both generations of durations, from the overrides or the defaults.
func merge(o *Options, d *pb.NodeGroupAutoscalingOptions) *pb.NodeGroupAutoscalingOptions {
	unneeded := seconds(o.ScaleDownUnneededTime, d.GetScaleDownUnneededDuration())
	unready := seconds(o.ScaleDownUnreadyTime, d.GetScaleDownUnreadyDuration())
	provision := seconds(o.MaxNodeProvisionTime, d.GetMaxNodeProvisionDuration())
	return &pb.NodeGroupAutoscalingOptions{
		ScaleDownUtilizationThreshold:    float(o.ScaleDownUtilizationThreshold, d.GetScaleDownUtilizationThreshold()),
		ScaleDownGpuUtilizationThreshold: float(o.ScaleDownGpuUtilizationThreshold, d.GetScaleDownGpuUtilizationThreshold()),
		ScaleDownUnneededTime:            k8sDuration(unneeded),
		ScaleDownUnreadyTime:             k8sDuration(unready),
		MaxNodeProvisionTime:             k8sDuration(provision),
		ZeroOrMaxNodeScaling:             boolean(o.ZeroOrMaxNodeScaling, d.GetZeroOrMaxNodeScaling()),
		IgnoreDaemonSetsUtilization:      boolean(o.IgnoreDaemonSetsUtilization, d.GetIgnoreDaemonSetsUtilization()),
		ScaleDownUnneededDuration:        durationpb.New(unneeded),
		ScaleDownUnreadyDuration:         durationpb.New(unready),
		MaxNodeProvisionDuration:         durationpb.New(provision),
	}
}

func seconds(override *float64, fallback *durationpb.Duration) time.Duration {
	if override != nil {
		return time.Duration(*override * float64(time.Second))
	}
	return fallback.AsDuration()
}

func k8sDuration(d time.Duration) *metav1.Duration {
	return &metav1.Duration{Duration: proto.Int64(int64(d))}
}

func float(override *float64, fallback float64) float64 {
	if override != nil {
		return *override
	}
	return fallback
}

func boolean(override *bool, fallback bool) bool {
	if override != nil {
		return *override
	}
	return fallback
}

func readState(path string) (*State, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var state State
	if err := json.Unmarshal(data, &state); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &state, nil
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "host:port to listen on (loopback)")
	statePath := flag.String("state", "", "state JSON: groups and the providerIDs in them")
	cert := flag.String("cert", "", "server certificate")
	key := flag.String("key", "", "server key")
	ca := flag.String("ca", "", "CA certificate that client certificates must chain to")
	allowed := flag.String("allowed-clients", "", "comma-separated client CN / DNS SANs (optional)")
	flag.Parse()
	if err := run(*listen, *statePath, *cert, *key, *ca, *allowed); err != nil {
		fmt.Fprintln(os.Stderr, "goref:", err)
		os.Exit(1)
	}
}

func run(listen, statePath, cert, key, ca, allowed string) error {
	state, err := readState(statePath)
	if err != nil {
		return err
	}
	srv, err := newServer(state)
	if err != nil {
		return err
	}
	var names []string
	if allowed != "" {
		names = strings.Split(allowed, ",")
	}
	tlsConfig, err := mtls.Server(cert, key, ca, names)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	grpcServer := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsConfig)))
	pb.RegisterCloudProviderServer(grpcServer, srv)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		grpcServer.Stop()
	}()
	fmt.Printf("goref listening on %s\n", lis.Addr())
	return grpcServer.Serve(lis)
}
