package main

// Which externalgrpc fields each Cluster Autoscaler release sends and reads. Facts from the
// upstream client (cloudprovider/externalgrpc) at the pinned release commits; see
// docs/conformance.md.

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Generation is one CA release's view of the wire.
type Generation struct {
	Release string
	// TemplateNodeInfo response: nodeInfo=1 (k8s Node message) and/or nodeBytes=2.
	// When both are read, nodeBytes wins and nodeInfo is the fallback.
	ReadsNodeInfo  bool
	ReadsNodeBytes bool
	// NodeGroupAutoscalingOptions durations: old = 3/4/5 (meta.v1.Duration),
	// new = 8/9/10 (google.protobuf.Duration). Sent in the request defaults, read in the answer.
	OldDurations bool
	NewDurations bool
	// Pricing requests: old = k8s Time 2/3 and (PodPrice) pod=1; new = Timestamp 4/5
	// (NodePrice) or pod_bytes=4 and Timestamp 5/6 (PodPrice).
	OldPricing bool
	NewPricing bool
}

var generations = map[string]Generation{
	// 1.34.0-1.34.1: only the old fields.
	"1.34.1": {Release: "1.34.1", ReadsNodeInfo: true, OldDurations: true, OldPricing: true},
	// 1.34.2+: sends both, reads the new fields first and falls back to the old ones.
	"1.34.5": {
		Release: "1.34.5", ReadsNodeInfo: true, ReadsNodeBytes: true,
		OldDurations: true, NewDurations: true, OldPricing: true, NewPricing: true,
	},
	// 1.35+: only the new fields.
	"1.36.1": {Release: "1.36.1", ReadsNodeBytes: true, NewDurations: true, NewPricing: true},
}

// releaseFromBuild derives the release from the main module path (".../ca-1.34.5"): the
// version module a binary was built with decides which generation it speaks, so the two
// cannot disagree.
func releaseFromBuild() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	path := info.Main.Path
	i := strings.LastIndex(path, "/ca-")
	if i < 0 {
		return ""
	}
	return path[i+len("/ca-"):]
}

func lookupGeneration(release string) (Generation, error) {
	if release == "" {
		release = releaseFromBuild()
	}
	gen, ok := generations[release]
	if !ok {
		return Generation{}, fmt.Errorf("unknown CA release %q (known: 1.34.1, 1.34.5, 1.36.1)", release)
	}
	return gen, nil
}
