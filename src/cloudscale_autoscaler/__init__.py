"""cloudscale-autoscaler: a Cluster Autoscaler externalgrpc provider for cloudscale.ch."""

__version__ = "0.1.0"
