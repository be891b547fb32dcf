package main

// Checks on the template Node as CA decoded it (TemplateNodeInfo().Node()).

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	apiv1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

const gpuResource apiv1.ResourceName = "nvidia.com/gpu"

var trailingDigits = regexp.MustCompile(`[0-9]+$`)

func checkTemplate(r *report, g *groupSpecs, node *apiv1.Node, gpuLabel string) {
	name := "template[" + g.ID + "]"
	if !r.check(name+".present", node != nil, "CA got a Node (a nil template crashes CA later)") {
		return
	}
	checkTemplateLabels(r, name, g, node, gpuLabel)
	checkTemplateTaints(r, name, g.Taints, node.Spec.Taints)
	checkTemplateResources(r, name, g, node)
	if g.Template != nil {
		checkTemplateMatchesRender(r, name, g.Template, node)
	}
}

func checkTemplateLabels(r *report, name string, g *groupSpecs, node *apiv1.Node, gpuLabel string) {
	want := map[string]string{
		"kubernetes.io/os":                 "linux",
		"kubernetes.io/arch":               "amd64",
		"node.kubernetes.io/instance-type": g.Flavor,
	}
	if g.Zone != "" {
		want["topology.kubernetes.io/zone"] = g.Zone
		want["topology.kubernetes.io/region"] = trailingDigits.ReplaceAllString(g.Zone, "")
	}
	for k, v := range g.Labels {
		want[k] = v
	}
	var bad []string
	for k, v := range want {
		if got, ok := node.Labels[k]; !ok || got != v {
			bad = append(bad, fmt.Sprintf("%s=%q (got %q)", k, v, got))
		}
	}
	sort.Strings(bad)
	r.check(name+".labels", len(bad) == 0, "want %d labels; wrong or missing: %v", len(want), bad)
	_, hasGPULabel := node.Labels[gpuLabel]
	r.check(name+".gpuLabel", hasGPULabel == (g.GPUs > 0),
		"GPU label %q present=%v for a group with %d GPUs", gpuLabel, hasGPULabel, g.GPUs)
}

func taintKey(t apiv1.Taint) string {
	return fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect)
}

func taintSet(ts []apiv1.Taint) []string {
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		out = append(out, taintKey(t))
	}
	sort.Strings(out)
	return out
}

func checkTemplateTaints(r *report, name string, want, got []apiv1.Taint) {
	w, g := taintSet(want), taintSet(got)
	r.check(name+".taints", strings.Join(w, ",") == strings.Join(g, ","), "want %v, got %v", w, g)
}

func quantityIs(list apiv1.ResourceList, res apiv1.ResourceName, want string) (bool, string) {
	got, ok := list[res]
	if !ok {
		return false, "missing"
	}
	return got.Cmp(resource.MustParse(want)) == 0, got.String()
}

func checkTemplateResources(r *report, name string, g *groupSpecs, node *apiv1.Node) {
	capacity, alloc := node.Status.Capacity, node.Status.Allocatable
	ok, got := quantityIs(capacity, apiv1.ResourceCPU, itoa(g.VCPUs))
	r.check(name+".capacity.cpu", ok, "want %d, got %s", g.VCPUs, got)
	if g.AllocatableCPU != "" {
		ok, got = quantityIs(alloc, apiv1.ResourceCPU, g.AllocatableCPU)
		r.check(name+".allocatable.cpu", ok, "want %s, got %s", g.AllocatableCPU, got)
	}
	ok, got = quantityIs(alloc, apiv1.ResourcePods, itoa(g.Pods))
	r.check(name+".allocatable.pods", ok, "want %d (without pods nothing fits), got %s", g.Pods, got)
	mem, hasMem := alloc[apiv1.ResourceMemory]
	r.check(name+".allocatable.memory", hasMem && mem.Sign() > 0, "positive, got %s", mem.String())
	var over []string
	for res, a := range alloc {
		c, ok := capacity[res]
		if !ok || a.Cmp(c) > 0 {
			over = append(over, fmt.Sprintf("%s: allocatable %s > capacity %s", res, a.String(), c.String()))
		}
	}
	r.check(name+".allocatable<=capacity", len(over) == 0, "%d resources; violations: %v", len(alloc), over)
	if g.GPUs > 0 {
		ok, got = quantityIs(alloc, gpuResource, itoa(g.GPUs))
		r.check(name+".allocatable.gpu", ok, "want %d %s, got %s", g.GPUs, gpuResource, got)
	} else {
		_, has := alloc[gpuResource]
		r.check(name+".allocatable.gpu", !has, "no %s on a group without GPUs", gpuResource)
	}
}

func resourceDiff(want, got apiv1.ResourceList) []string {
	var diff []string
	for res, w := range want {
		if g, ok := got[res]; !ok || g.Cmp(w) != 0 {
			diff = append(diff, fmt.Sprintf("%s: rendered %s, CA saw %s", res, w.String(), g.String()))
		}
	}
	for res, g := range got {
		if _, ok := want[res]; !ok {
			diff = append(diff, fmt.Sprintf("%s: not rendered, CA saw %s", res, g.String()))
		}
	}
	sort.Strings(diff)
	return diff
}

// checkTemplateMatchesRender: nothing of what our renderer meant is lost or changed on the wire.
func checkTemplateMatchesRender(r *report, name string, want, got *apiv1.Node) {
	d := resourceDiff(want.Status.Capacity, got.Status.Capacity)
	r.check(name+".render.capacity", len(d) == 0, "%d resources; differences: %v", len(want.Status.Capacity), d)
	d = resourceDiff(want.Status.Allocatable, got.Status.Allocatable)
	r.check(name+".render.allocatable", len(d) == 0, "%d resources; differences: %v", len(want.Status.Allocatable), d)
	var ld []string
	for k, v := range want.Labels {
		if got.Labels[k] != v {
			ld = append(ld, fmt.Sprintf("%s: rendered %q, CA saw %q", k, v, got.Labels[k]))
		}
	}
	for k := range got.Labels {
		if _, ok := want.Labels[k]; !ok {
			ld = append(ld, "extra "+k)
		}
	}
	sort.Strings(ld)
	r.check(name+".render.labels", len(ld) == 0, "%d labels; differences: %v", len(want.Labels), ld)
	checkTemplateTaints(r, name+".render", want.Spec.Taints, got.Spec.Taints)
}
