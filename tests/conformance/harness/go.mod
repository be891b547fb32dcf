// Placeholder: the harness is always built with a version module's go.mod
// (go build -modfile ../ca-<release>/go.mod), never with this one. It exists because
// -modfile still needs a go.mod in the main module's directory.
module cloudscale-autoscaler/conformance/harness

go 1.24.0
