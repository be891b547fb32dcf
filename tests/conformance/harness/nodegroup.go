package main

// The node-group half of the wire-level CA client (see client.go).

import (
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type wireNodeGroup struct {
	*rpc
	id, debug        string
	minSize, maxSize int

	mu       sync.Mutex
	template **apiv1.Node // cached TemplateNodeInfo result, possibly a cached nil
}

func (n *wireNodeGroup) Id() string    { return n.id }
func (n *wireNodeGroup) MinSize() int  { return n.minSize }
func (n *wireNodeGroup) MaxSize() int  { return n.maxSize }
func (n *wireNodeGroup) Debug() string { return n.debug }

func (n *wireNodeGroup) idRequest() []byte {
	var e enc
	e.str(1, n.id)
	return e.b
}

func (n *wireNodeGroup) TargetSize() (int, error) {
	res, err := n.call("NodeGroupTargetSize", n.idRequest())
	if err != nil {
		return 0, err
	}
	return int(res.int32(1, "targetSize")), nil
}

func (n *wireNodeGroup) deltaRequest(delta int) []byte {
	var e enc
	e.int32(1, int32(delta))
	e.str(2, n.id)
	return e.b
}

func (n *wireNodeGroup) IncreaseSize(delta int) error {
	_, err := n.call("NodeGroupIncreaseSize", n.deltaRequest(delta))
	return err
}

func (n *wireNodeGroup) DecreaseTargetSize(delta int) error {
	_, err := n.call("NodeGroupDecreaseTargetSize", n.deltaRequest(delta))
	return err
}

func (n *wireNodeGroup) DeleteNodes(nodes []*apiv1.Node) error {
	var e enc
	for _, node := range nodes {
		e.message(1, externalNode(node))
	}
	e.str(2, n.id)
	_, err := n.call("NodeGroupDeleteNodes", e.b)
	return err
}

func (n *wireNodeGroup) Nodes() ([]Instance, error) {
	res, err := n.call("NodeGroupNodes", n.idRequest())
	if err != nil {
		return nil, err
	}
	items, err := res.repeated(1, "instances")
	if err != nil {
		return nil, err
	}
	instances := []Instance{}
	for _, item := range items {
		inst, err := decodeInstance(item)
		if err != nil {
			return nil, err
		}
		instances = append(instances, inst)
	}
	return instances, nil
}

func decodeInstance(m msg) (Instance, error) {
	inst := Instance{Id: m.str(1, "id")}
	st, _, err := m.sub(2, "status")
	if err != nil {
		return inst, err
	}
	state := InstanceState(st.int32(1, "instanceState"))
	if state == 0 { // unspecified: CA keeps no status at all
		return inst, nil
	}
	inst.Status = &InstanceStatus{State: state}
	info, _, err := st.sub(2, "errorInfo")
	if err != nil {
		return inst, err
	}
	if code := info.str(1, "errorCode"); code != "" {
		inst.Status.ErrorInfo = &InstanceErrorInfo{
			ErrorCode:    code,
			ErrorMessage: info.str(2, "errorMessage"),
			ErrorClass:   int(info.int32(3, "instanceErrorClass")),
		}
	}
	return inst, nil
}

func (n *wireNodeGroup) TemplateNode() (*apiv1.Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.template != nil {
		return *n.template, nil
	}
	res, err := n.call("NodeGroupTemplateNodeInfo", n.idRequest())
	if err != nil {
		if isUnimplemented(err) {
			return nil, ErrNotImplemented
		}
		return nil, err
	}
	node, err := n.readTemplate(res)
	if err != nil {
		return nil, err
	}
	n.template = &node
	return node, nil
}

// readTemplate picks the field this generation reads and decodes it with k8s.io/api.
func (n *wireNodeGroup) readTemplate(res msg) (*apiv1.Node, error) {
	if n.gen.ReadsNodeBytes {
		if b := res.bytesField(2, "nodeBytes"); b != nil {
			node := &apiv1.Node{}
			if err := node.Unmarshal(b); err != nil {
				return nil, err
			}
			return node, nil
		}
	}
	if n.gen.ReadsNodeInfo {
		if b, ok := res.subRaw(1, "nodeInfo"); ok {
			node := &apiv1.Node{}
			if err := node.Unmarshal(b); err != nil {
				return nil, err
			}
			return node, nil
		}
	}
	return nil, nil
}

func k8sDuration(d time.Duration) []byte {
	md := metav1.Duration{Duration: d}
	b, err := md.Marshal()
	if err != nil {
		panic(err)
	}
	return b
}

func protoDuration(d time.Duration) []byte {
	b, err := proto.Marshal(durationpb.New(d))
	if err != nil {
		panic(err)
	}
	return b
}

func (n *wireNodeGroup) optionsRequest(d Options) []byte {
	var o enc
	o.double(1, d.ScaleDownUtilizationThreshold)
	o.double(2, d.ScaleDownGpuUtilizationThreshold)
	if n.gen.OldDurations {
		o.message(3, k8sDuration(d.ScaleDownUnneededTime))
		o.message(4, k8sDuration(d.ScaleDownUnreadyTime))
		o.message(5, k8sDuration(d.MaxNodeProvisionTime))
	}
	o.boolean(6, d.ZeroOrMaxNodeScaling)
	o.boolean(7, d.IgnoreDaemonSetsUtilization)
	if n.gen.NewDurations {
		o.message(8, protoDuration(d.ScaleDownUnneededTime))
		o.message(9, protoDuration(d.ScaleDownUnreadyTime))
		o.message(10, protoDuration(d.MaxNodeProvisionTime))
	}
	var req enc
	req.str(1, n.id)
	req.message(2, o.b)
	return req.b
}

// readDuration reads one duration the way this generation does. CA 1.34.x dereferences the
// old meta.v1.Duration without a nil check when it falls back to it: a missing field there
// is a nil-pointer panic inside CA, reported here as an error.
func (n *wireNodeGroup) readDuration(o msg, oldNum, newNum protowire.Number, name string) (time.Duration, error) {
	if n.gen.NewDurations {
		if raw, ok := o.subRaw(newNum, name+"Duration"); ok {
			var d durationpb.Duration
			if err := proto.Unmarshal(raw, &d); err != nil {
				return 0, err
			}
			return d.AsDuration(), nil
		}
		if !n.gen.OldDurations {
			return 0, nil // 1.35+: unset means 0s
		}
	}
	raw, ok := o.subRaw(oldNum, name+"Time")
	if !ok {
		return 0, fmt.Errorf("CA %s would panic: field %d (%sTime) is nil and read without a check",
			n.gen.Release, oldNum, name)
	}
	var d metav1.Duration
	if err := d.Unmarshal(raw); err != nil {
		return 0, err
	}
	return d.Duration, nil
}

func (n *wireNodeGroup) GetOptions(defaults Options) (*Options, error) {
	res, err := n.call("NodeGroupGetOptions", n.optionsRequest(defaults))
	if err != nil {
		if isUnimplemented(err) {
			return nil, ErrNotImplemented
		}
		return nil, err
	}
	o, present, err := res.sub(1, "nodeGroupAutoscalingOptions")
	if err != nil || !present {
		return nil, err
	}
	opts := &Options{
		ScaleDownUtilizationThreshold:    o.double(1, "scaleDownUtilizationThreshold"),
		ScaleDownGpuUtilizationThreshold: o.double(2, "scaleDownGpuUtilizationThreshold"),
		ZeroOrMaxNodeScaling:             o.boolean(6, "zeroOrMaxNodeScaling"),
		IgnoreDaemonSetsUtilization:      o.boolean(7, "ignoreDaemonSetsUtilization"),
	}
	if opts.ScaleDownUnneededTime, err = n.readDuration(o, 3, 8, "scaleDownUnneeded"); err != nil {
		return nil, err
	}
	if opts.ScaleDownUnreadyTime, err = n.readDuration(o, 4, 9, "scaleDownUnready"); err != nil {
		return nil, err
	}
	if opts.MaxNodeProvisionTime, err = n.readDuration(o, 5, 10, "maxNodeProvision"); err != nil {
		return nil, err
	}
	return opts, nil
}
