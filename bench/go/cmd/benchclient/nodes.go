package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "cloudscale-autoscaler/bench/internal/pb"
)

// NodeRef is one Kubernetes node of the nodes file the benchmark writes.
type NodeRef struct {
	ProviderID string `json:"providerID"`
	Name       string `json:"name"`
}

func readNodes(path string) ([]NodeRef, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var file struct {
		Nodes []NodeRef `json:"nodes"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return file.Nodes, nil
}

// grpcNode is what CA sends for a node: providerID, name, and the node's labels and
// annotations, here the ones a kubeadm node on cloudscale.ch typically carries.
func grpcNode(ref NodeRef) *pb.ExternalGrpcNode {
	uuid := strings.TrimPrefix(ref.ProviderID, "cloudscale://")
	return &pb.ExternalGrpcNode{
		ProviderID: ref.ProviderID,
		Name:       ref.Name,
		Labels: map[string]string{
			"beta.kubernetes.io/arch":                  "amd64",
			"beta.kubernetes.io/instance-type":         "flex-4-2",
			"beta.kubernetes.io/os":                    "linux",
			"failure-domain.beta.kubernetes.io/region": "lpg",
			"failure-domain.beta.kubernetes.io/zone":   "lpg1",
			"kubernetes.io/arch":                       "amd64",
			"kubernetes.io/hostname":                   ref.Name,
			"kubernetes.io/os":                         "linux",
			"node-role.kubernetes.io/worker":           "",
			"node.kubernetes.io/instance-type":         "flex-4-2",
			"topology.kubernetes.io/region":            "lpg",
			"topology.kubernetes.io/zone":              "lpg1",
		},
		Annotations: map[string]string{
			"csi.volume.kubernetes.io/nodeid":                        `{"csi.cloudscale.ch":"` + uuid + `"}`,
			"kubeadm.alpha.kubernetes.io/cri-socket":                 "unix:///run/containerd/containerd.sock",
			"node.alpha.kubernetes.io/ttl":                           "0",
			"volumes.kubernetes.io/controller-managed-attach-detach": "true",
		},
	}
}

// caDefaults is what CA 1.36 sends as GetOptions defaults with its default flags (only the
// google.protobuf.Duration generation of the durations).
func caDefaults() *pb.NodeGroupAutoscalingOptions {
	return &pb.NodeGroupAutoscalingOptions{
		ScaleDownUtilizationThreshold:    0.5,
		ScaleDownGpuUtilizationThreshold: 0.5,
		ScaleDownUnneededDuration:        durationpb.New(10 * time.Minute),
		ScaleDownUnreadyDuration:         durationpb.New(20 * time.Minute),
		MaxNodeProvisionDuration:         durationpb.New(15 * time.Minute),
	}
}
