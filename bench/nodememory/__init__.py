"""The provider's memory as a cluster sees it: the chart's Pods on a real kubelet, their
containers' cgroup and the kubelet's working set beside the process's RSS, at idle and under
the real Cluster Autoscaler's loop at 1,000 Nodes (bench/README.md, "Memory on a real node")."""
