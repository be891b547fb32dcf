package main

// The expectations file the test writes: what our configuration says CA must see.

import (
	"encoding/json"
	"fmt"
	"os"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type expectations struct {
	Cluster    string `json:"cluster"`
	Image      string `json:"image"`
	GPULabel   string `json:"gpuLabel"`
	ScaleGroup string `json:"scaleGroup"` // the group the scaling steps use
	OtherGroup string `json:"otherGroup"` // a second group, for the cross-group delete
	// GPUTypes, when given, is the exact set GetAvailableGPUTypes must return.
	GPUTypes []string `json:"gpuTypes"`
	// RejectedCloudConfigs must not get a working connection (wrong CA, foreign client cert).
	RejectedCloudConfigs []namedPath `json:"rejectedCloudConfigs"`
	// Defaults are the options CA passes to GetOptions.
	Defaults optionsJSON  `json:"defaults"`
	Groups   []groupSpecs `json:"groups"`
	// Pricing: the prices CA must read; nil means the server has no `pricing` section.
	Pricing *pricingSpecs `json:"pricing"`
}

type namedPath struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

type groupSpecs struct {
	ID      string `json:"id"`
	MinSize int    `json:"minSize"`
	MaxSize int    `json:"maxSize"`
	Flavor  string `json:"flavor"`
	Zone    string `json:"zone"`
	VCPUs   int    `json:"vcpus"`
	GPUs    int    `json:"gpus"`
	// AllocatableCPU, e.g. "3850m": vCPUs minus the configured cpu reservations.
	AllocatableCPU string            `json:"allocatableCpu"`
	Pods           int               `json:"pods"`
	Labels         map[string]string `json:"labels"`
	Taints         []apiv1.Taint     `json:"taints"`
	// Options: what GetOptions must return with Defaults; nil means Unimplemented.
	Options *optionsJSON `json:"options"`
	// Template, when given, is the Node our renderer produces for this group: CA must see
	// exactly its labels, taints, capacity and allocatable.
	Template *apiv1.Node `json:"template"`
}

type optionsJSON struct {
	ScaleDownUtilizationThreshold    float64         `json:"scaleDownUtilizationThreshold"`
	ScaleDownGpuUtilizationThreshold float64         `json:"scaleDownGpuUtilizationThreshold"`
	ScaleDownUnneededTime            metav1.Duration `json:"scaleDownUnneededTime"`
	ScaleDownUnreadyTime             metav1.Duration `json:"scaleDownUnreadyTime"`
	MaxNodeProvisionTime             metav1.Duration `json:"maxNodeProvisionTime"`
	ZeroOrMaxNodeScaling             bool            `json:"zeroOrMaxNodeScaling"`
	IgnoreDaemonSetsUtilization      bool            `json:"ignoreDaemonSetsUtilization"`
}

func (o optionsJSON) options() Options {
	return Options{
		ScaleDownUtilizationThreshold:    o.ScaleDownUtilizationThreshold,
		ScaleDownGpuUtilizationThreshold: o.ScaleDownGpuUtilizationThreshold,
		ScaleDownUnneededTime:            o.ScaleDownUnneededTime.Duration,
		ScaleDownUnreadyTime:             o.ScaleDownUnreadyTime.Duration,
		MaxNodeProvisionTime:             o.MaxNodeProvisionTime.Duration,
		ZeroOrMaxNodeScaling:             o.ZeroOrMaxNodeScaling,
		IgnoreDaemonSetsUtilization:      o.IgnoreDaemonSetsUtilization,
	}
}

func readExpectations(path string) (*expectations, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var exp expectations
	if err := json.Unmarshal(data, &exp); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if exp.Cluster == "" || exp.ScaleGroup == "" || len(exp.Groups) == 0 {
		return nil, fmt.Errorf("%s: cluster, scaleGroup and groups are required", path)
	}
	if exp.group(exp.ScaleGroup) == nil {
		return nil, fmt.Errorf("%s: scaleGroup %q is not in groups", path, exp.ScaleGroup)
	}
	return &exp, nil
}

func (e *expectations) group(id string) *groupSpecs {
	for i := range e.Groups {
		if e.Groups[i].ID == id {
			return &e.Groups[i]
		}
	}
	return nil
}
