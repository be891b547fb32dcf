// Cluster Autoscaler 1.34.1 (kubernetes/autoscaler bc1475d5b294f52d46fede25f37113840067ecbf, module k8s.io/autoscaler/cluster-autoscaler).
// The harness (../harness) is built with this file: go build -modfile ../ca-1.34.1/go.mod.
// Direct dependencies are pinned to the versions that CA release requires, and its replace
// directives are mirrored below (its local ./apis replace excepted: nothing here imports it).
module cloudscale-autoscaler/conformance/ca-1.34.1

go 1.24.0

require (
	google.golang.org/grpc v1.72.1
	google.golang.org/protobuf v1.36.5
	k8s.io/api v0.34.1
	k8s.io/apimachinery v0.34.1
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/fxamacker/cbor/v2 v2.9.0 // indirect
	github.com/go-logr/logr v1.4.2 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	go.opentelemetry.io/otel v1.35.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/net v0.38.0 // indirect
	golang.org/x/sys v0.31.0 // indirect
	golang.org/x/text v0.23.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250303144028-a0af3efb3deb // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	k8s.io/klog/v2 v2.130.1 // indirect
	k8s.io/utils v0.0.0-20250604170112-4c0f3b243397 // indirect
	sigs.k8s.io/json v0.0.0-20241014173422-cfa47c3a1cc8 // indirect
	sigs.k8s.io/randfill v1.0.0 // indirect
	sigs.k8s.io/structured-merge-diff/v6 v6.3.0 // indirect
)

replace github.com/aws/aws-sdk-go/service/eks => github.com/aws/aws-sdk-go/service/eks v1.38.49

replace github.com/digitalocean/godo => github.com/digitalocean/godo v1.27.0

replace github.com/rancher/go-rancher => github.com/rancher/go-rancher v0.1.0

replace k8s.io/api => k8s.io/api v0.34.1

replace k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.34.1

replace k8s.io/apimachinery => k8s.io/apimachinery v0.34.1

replace k8s.io/apiserver => k8s.io/apiserver v0.34.1

replace k8s.io/cli-runtime => k8s.io/cli-runtime v0.34.1

replace k8s.io/client-go => k8s.io/client-go v0.34.1

replace k8s.io/cloud-provider => k8s.io/cloud-provider v0.34.1

replace k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.34.1

replace k8s.io/code-generator => k8s.io/code-generator v0.34.1

replace k8s.io/component-base => k8s.io/component-base v0.34.1

replace k8s.io/component-helpers => k8s.io/component-helpers v0.34.1

replace k8s.io/controller-manager => k8s.io/controller-manager v0.34.1

replace k8s.io/cri-api => k8s.io/cri-api v0.34.1

replace k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.34.1

replace k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.34.1

replace k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.34.1

replace k8s.io/kube-proxy => k8s.io/kube-proxy v0.34.1

replace k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.34.1

replace k8s.io/kubectl => k8s.io/kubectl v0.34.1

replace k8s.io/kubelet => k8s.io/kubelet v0.34.1

replace k8s.io/metrics => k8s.io/metrics v0.34.1

replace k8s.io/mount-utils => k8s.io/mount-utils v0.34.1

replace k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.34.1

replace k8s.io/sample-cli-plugin => k8s.io/sample-cli-plugin v0.34.1

replace k8s.io/sample-controller => k8s.io/sample-controller v0.34.1

replace k8s.io/pod-security-admission => k8s.io/pod-security-admission v0.34.1

replace k8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation v0.34.1

replace k8s.io/kms => k8s.io/kms v0.34.1

replace k8s.io/endpointslice => k8s.io/endpointslice v0.34.1

replace k8s.io/cri-client => k8s.io/cri-client v0.34.1

replace k8s.io/externaljwt => k8s.io/externaljwt v0.34.1
