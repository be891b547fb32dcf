"""The real-CA workload (`python -m bench --workload real-ca`, bench/README.md): the real
Cluster Autoscaler binary of each generation against N idle nodes, on a loopback
kube-apiserver. Apart from the default run: it needs the tests' Kubernetes tools and CA
builds, and takes minutes per generation and size."""
