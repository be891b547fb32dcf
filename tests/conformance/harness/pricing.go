package main

// The pricing scenario: our server configured with prices, driven the way CA's price expander
// drives it (expander/price/price.go): NodePrice for every option's template node over
// [now, now+1h], PodPrice for pods and for the 500m/500Mi stabilization pod.

import (
	"errors"
	"fmt"
	"time"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// pricingSpecs is what the prices configured for the server make CA's client return.
type pricingSpecs struct {
	// NodePrices: per group id, the price of its template node for exactly one hour.
	NodePrices map[string]float64 `json:"nodePrices"`
	// PodPrice: the price of stabilizationPod() for exactly one hour.
	PodPrice float64 `json:"podPrice"`
}

// stabilizationPod is CA's priceStabilizationPod: 500m CPU, 500Mi memory.
func stabilizationPod() *apiv1.Pod {
	return &apiv1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stabilize", Namespace: "default"},
		Spec: apiv1.PodSpec{Containers: []apiv1.Container{{
			Resources: apiv1.ResourceRequirements{Requests: apiv1.ResourceList{
				apiv1.ResourceCPU:    *resource.NewMilliQuantity(500, resource.DecimalSI),
				apiv1.ResourceMemory: resource.MustParse("500Mi"),
			}},
		}}},
	}
}

// sanitizedTemplate is the template as CA keeps it in its node infos: renamed, hostname label
// overwritten, everything else (labels, annotations) as the provider sent it.
func sanitizedTemplate(node *apiv1.Node, group string) *apiv1.Node {
	out := node.DeepCopy()
	out.Name = fmt.Sprintf("template-node-for-%s-%d", group, time.Now().UnixNano()%100000)
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	out.Labels[apiv1.LabelHostname] = out.Name
	return out
}

func (s *scenario) runPricing() {
	p := s.exp.Pricing
	s.r.require("expect.pricing", p != nil, "the pricing scenario needs expected prices")
	s.r.mustNoErr("Refresh", s.cp.Refresh(), "ok")
	start := time.Now()
	end := start.Add(time.Hour)
	priced := 0
	for _, ng := range s.cp.NodeGroups() {
		want, ok := p.NodePrices[ng.Id()]
		if !ok {
			continue
		}
		priced++
		name := "Pricing.NodePrice[template " + ng.Id() + "]"
		tmpl, err := ng.TemplateNode()
		if !s.r.noErr("TemplateNodeInfo["+ng.Id()+"]", err, "ok") || tmpl == nil {
			continue
		}
		price, err := s.cp.NodePrice(sanitizedTemplate(tmpl, ng.Id()), start, end)
		s.r.check(name, err == nil && price == want, "want %v, got %v err=%v", want, price, err)
	}
	s.r.check("Pricing.groups", priced == len(p.NodePrices),
		"every expected group priced: %d of %d", priced, len(p.NodePrices))

	// A node of another provider: an error the expander logs and skips, not "not implemented".
	price, err := s.cp.NodePrice(nodeFor("not-ours", "aws:///eu-west-1a/i-0123456789"), start, end)
	st, _ := status.FromError(err)
	s.r.check("Pricing.NodePrice[unknown node]",
		err != nil && !errors.Is(err, ErrNotImplemented) && st.Code() == codes.NotFound,
		"want a NotFound error (the option is skipped), got price %v err=%v", price, err)

	price, err = s.cp.PodPrice(stabilizationPod(), start, end)
	s.r.check("Pricing.PodPrice", err == nil && price == p.PodPrice,
		"want %v, got %v err=%v", p.PodPrice, price, err)
	s.r.noErr("Cleanup", s.cp.Cleanup(), "ok")
	s.checkWire()
}
