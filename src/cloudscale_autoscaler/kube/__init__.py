"""The Kubernetes side: API access, template drift checks and leader election."""
