// Cluster Autoscaler 1.36.1 (kubernetes/autoscaler 35e8a280425c76a4040f57ae0fa232a952c02024, module k8s.io/autoscaler/cluster-autoscaler).
// The harness (../harness) is built with this file: go build -modfile ../ca-1.36.1/go.mod.
// Direct dependencies are pinned to the versions that CA release requires, and its replace
// directives are mirrored below (its local ./apis replace excepted: nothing here imports it).
module cloudscale-autoscaler/conformance/ca-1.36.1

go 1.26.0

godebug default=go1.26

require (
	google.golang.org/grpc v1.81.1
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af
	k8s.io/api v0.36.2
	k8s.io/apimachinery v0.36.2
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/fxamacker/cbor/v2 v2.9.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	go.opentelemetry.io/otel v1.44.0 // indirect
	go.opentelemetry.io/otel/sdk/metric v1.44.0 // indirect
	go.yaml.in/yaml/v2 v2.4.3 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sys v0.46.0 // indirect
	golang.org/x/text v0.38.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260226221140-a57be14db171 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/kube-openapi v0.0.0-20260317180543-43fb72c5454a // indirect
	k8s.io/utils v0.0.0-20260210185600-b8788abfbbc2 // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
	sigs.k8s.io/randfill v1.0.0 // indirect
	sigs.k8s.io/structured-merge-diff/v6 v6.3.2 // indirect
)

replace github.com/aws/aws-sdk-go/service/eks => github.com/aws/aws-sdk-go/service/eks v1.38.49

replace github.com/rancher/go-rancher => github.com/rancher/go-rancher v0.1.0

replace k8s.io/api => k8s.io/api v0.36.2

replace k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.36.2

replace k8s.io/apimachinery => k8s.io/apimachinery v0.36.2

replace k8s.io/apiserver => k8s.io/apiserver v0.36.2

replace k8s.io/cli-runtime => k8s.io/cli-runtime v0.36.2

replace k8s.io/client-go => k8s.io/client-go v0.36.2

replace k8s.io/cloud-provider => k8s.io/cloud-provider v0.36.2

replace k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.36.2

replace k8s.io/code-generator => k8s.io/code-generator v0.36.2

replace k8s.io/component-base => k8s.io/component-base v0.36.2

replace k8s.io/component-helpers => k8s.io/component-helpers v0.36.2

replace k8s.io/controller-manager => k8s.io/controller-manager v0.36.2

replace k8s.io/cri-api => k8s.io/cri-api v0.36.2

replace k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.36.2

replace k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.36.2

replace k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.36.2

replace k8s.io/kube-proxy => k8s.io/kube-proxy v0.36.2

replace k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.36.2

replace k8s.io/kubectl => k8s.io/kubectl v0.36.2

replace k8s.io/kubelet => k8s.io/kubelet v0.36.2

replace k8s.io/metrics => k8s.io/metrics v0.36.2

replace k8s.io/mount-utils => k8s.io/mount-utils v0.36.2

replace k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.36.2

replace k8s.io/sample-cli-plugin => k8s.io/sample-cli-plugin v0.36.2

replace k8s.io/sample-controller => k8s.io/sample-controller v0.36.2

replace k8s.io/pod-security-admission => k8s.io/pod-security-admission v0.36.2

replace k8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation v0.36.2

replace k8s.io/kms => k8s.io/kms v0.36.2

replace k8s.io/endpointslice => k8s.io/endpointslice v0.36.2

replace k8s.io/cri-client => k8s.io/cri-client v0.36.2

replace k8s.io/externaljwt => k8s.io/externaljwt v0.36.2

replace k8s.io/cri-streaming => k8s.io/cri-streaming v0.36.2

replace k8s.io/streaming => k8s.io/streaming v0.36.2
