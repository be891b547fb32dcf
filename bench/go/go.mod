// The benchmark's Go programs: the reference server (cmd/goref) and the load client
// (cmd/benchclient). grpc-go and protobuf-go are pinned to the versions Cluster Autoscaler
// 1.36.1 uses (as in tests/conformance/ca-1.36.1/go.mod), so the client speaks gRPC the way
// that CA release does. The protobuf code in internal/pb is generated from proto/ at build
// time by `python -m bench` and is not committed.
module cloudscale-autoscaler/bench

go 1.26.0

require (
	google.golang.org/grpc v1.81.1
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af
)

require (
	golang.org/x/net v0.51.0 // indirect
	golang.org/x/sys v0.42.0 // indirect
	golang.org/x/text v0.34.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260226221140-a57be14db171 // indirect
)
