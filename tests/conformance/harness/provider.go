package main

// The slice of Cluster Autoscaler's cloudprovider.CloudProvider / cloudprovider.NodeGroup
// interfaces that CA's core calls on an externalgrpc provider, with CA's own value types.
// The scenario only talks to these interfaces, so the client behind them can be swapped.

import (
	"errors"
	"time"

	apiv1 "k8s.io/api/core/v1"
)

// ErrNotImplemented is what CA's client returns when the provider answers codes.Unimplemented
// for TemplateNodeInfo, GetOptions or pricing (same text as cloudprovider.ErrNotImplemented).
var ErrNotImplemented = errors.New("Not implemented")

// CloudProvider is the provider-level surface CA's core uses.
type CloudProvider interface {
	Refresh() error
	NodeGroups() []NodeGroup
	// NodeGroupForNode returns (nil, nil) for a node the provider does not manage.
	NodeGroupForNode(node *apiv1.Node) (NodeGroup, error)
	GPULabel() string
	GetAvailableGPUTypes() map[string]struct{}
	NodePrice(node *apiv1.Node, start, end time.Time) (float64, error)
	PodPrice(pod *apiv1.Pod, start, end time.Time) (float64, error)
	Cleanup() error
}

// NodeGroup is the group-level surface CA's core uses.
type NodeGroup interface {
	Id() string
	MinSize() int
	MaxSize() int
	Debug() string
	TargetSize() (int, error)
	IncreaseSize(delta int) error
	DeleteNodes(nodes []*apiv1.Node) error
	DecreaseTargetSize(delta int) error
	Nodes() ([]Instance, error)
	// TemplateNode is TemplateNodeInfo().Node(): the Node inside CA's NodeInfo, or nil when
	// CA got no node (it caches that nil and later dereferences it).
	TemplateNode() (*apiv1.Node, error)
	// GetOptions returns nil options when the provider sent none (CA then uses defaults).
	GetOptions(defaults Options) (*Options, error)
}

// InstanceState mirrors cloudprovider.InstanceState.
type InstanceState int

// The states CA knows; the numbers are CA's (and the wire enum's).
const (
	InstanceRunning  InstanceState = 1
	InstanceCreating InstanceState = 2
	InstanceDeleting InstanceState = 3
)

func (s InstanceState) String() string {
	switch s {
	case InstanceRunning:
		return "Running"
	case InstanceCreating:
		return "Creating"
	case InstanceDeleting:
		return "Deleting"
	}
	return "State(" + itoa(int(s)) + ")"
}

// CA's InstanceErrorClass values.
const (
	OutOfResourcesErrorClass = 1
	OtherErrorClass          = 99
)

// Instance mirrors cloudprovider.Instance: Status is nil when the provider sent state
// "unspecified" (CA then drops any error info too).
type Instance struct {
	Id     string
	Status *InstanceStatus
}

// InstanceStatus mirrors cloudprovider.InstanceStatus.
type InstanceStatus struct {
	State     InstanceState
	ErrorInfo *InstanceErrorInfo
}

// InstanceErrorInfo mirrors cloudprovider.InstanceErrorInfo.
type InstanceErrorInfo struct {
	ErrorClass   int
	ErrorCode    string
	ErrorMessage string
}

// Options mirrors the fields of config.NodeGroupAutoscalingOptions that externalgrpc carries.
type Options struct {
	ScaleDownUtilizationThreshold    float64
	ScaleDownGpuUtilizationThreshold float64
	ScaleDownUnneededTime            time.Duration
	ScaleDownUnreadyTime             time.Duration
	MaxNodeProvisionTime             time.Duration
	ZeroOrMaxNodeScaling             bool
	IgnoreDaemonSetsUtilization      bool
}
