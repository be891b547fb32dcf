{{/* Chart name, or nameOverride; a DNS label. */}}
{{- define "cloudscale-autoscaler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Base name of every object: fullnameOverride, else the release name when it already contains
the chart name, else <release>-<chart>. Also the Service name, hence a DNS label (63 chars).
*/}}
{{- define "cloudscale-autoscaler.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "cloudscale-autoscaler.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cloudscale-autoscaler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cloudscale-autoscaler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cloudscale-autoscaler.labels" -}}
{{ include "cloudscale-autoscaler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
The provider's account. An existing one (create: false) is named explicitly and is never the
namespace's `default`: the rights bound to it would go to every Pod without an account of its
own (values.schema.json refuses `default` too; this also catches an empty name).
*/}}
{{- define "cloudscale-autoscaler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cloudscale-autoscaler.fullname" .) .Values.serviceAccount.name -}}
{{- else if or (not .Values.serviceAccount.name) (eq .Values.serviceAccount.name "default") -}}
{{- fail "serviceAccount.name: with serviceAccount.create false, name the existing account the provider runs as (not the namespace's default account, whose rights every Pod without an account of its own would get)" -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given (what a signature covers). */}}
{{- define "cloudscale-autoscaler.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The config settings a running provider cannot reload (src/cloudscale_autoscaler/reload/fixed.py:
everything but RELOADABLE's keys), as a checksum for the Pod template: with reloadConfig, a
change of one of them rolls the Pods, while a change of the rest is reloaded in place.
*/}}
{{- define "cloudscale-autoscaler.restartChecksum" -}}
{{- $config := fromYaml (include "cloudscale-autoscaler.config" .) -}}
{{- omit $config "nodeGroups" "pricing" "placeholderExpiry" "increaseSizeWait" | toYaml | sha256sum -}}
{{- end -}}

{{- define "cloudscale-autoscaler.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "cloudscale-autoscaler.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{- define "cloudscale-autoscaler.clientSecretName" -}}
{{- default (printf "%s-client-tls" (include "cloudscale-autoscaler.fullname" .)) .Values.certManager.client.secretName -}}
{{- end -}}

{{- define "cloudscale-autoscaler.cloudConfigName" -}}
{{- default (printf "%s-cloud-config" (include "cloudscale-autoscaler.fullname" .)) .Values.cloudConfig.name -}}
{{- end -}}

{{/* The host CA dials; also the TLS ServerName, so it is one of the server dnsNames. */}}
{{- define "cloudscale-autoscaler.serviceHost" -}}
{{- printf "%s.%s.svc" (include "cloudscale-autoscaler.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* Where the container finds what it mounts; the config file points at these. */}}
{{- define "cloudscale-autoscaler.tlsDir" -}}/etc/cloudscale-autoscaler/tls{{- end -}}
{{- define "cloudscale-autoscaler.tokenDir" -}}/etc/cloudscale-autoscaler/token{{- end -}}
{{- define "cloudscale-autoscaler.configDir" -}}/etc/cloudscale-autoscaler/config{{- end -}}
{{- define "cloudscale-autoscaler.configPath" -}}{{ include "cloudscale-autoscaler.configDir" . }}/config.yaml{{- end -}}

{{/*
The config file: .Values.config plus the settings tied to this pod (listen addresses, TLS
files, token file), which the chart owns so they always match the mounts and ports.
*/}}
{{- define "cloudscale-autoscaler.config" -}}
{{- include "cloudscale-autoscaler.checkNodeGroups" . -}}
{{- $cfg := deepCopy .Values.config -}}
{{- range $key, $from := dict "listen" "ports.grpc" "tls" "tls and certManager" "metrics" "ports.metrics" "kubernetes" "kubernetes" "stateDir" "kubernetes (a ConfigMap with it, an emptyDir without)" -}}
{{- if hasKey $cfg $key -}}
{{- fail (printf "config.%s is set by the chart (from %s); remove it from config" $key $from) -}}
{{- end -}}
{{- end -}}
{{- if and (kindIs "map" $cfg.cloudscale) (hasKey $cfg.cloudscale "tokenFile") -}}
{{- fail "config.cloudscale.tokenFile is set by the chart (from tokenSecret); remove it from config" -}}
{{- end -}}
{{- $tlsDir := include "cloudscale-autoscaler.tlsDir" . -}}
{{- $tls := dict "cert" (printf "%s/tls.crt" $tlsDir) "key" (printf "%s/tls.key" $tlsDir) "clientCA" (printf "%s/ca.crt" $tlsDir) -}}
{{- with .Values.tls.allowedClients -}}
{{- $_ := set $tls "allowedClients" . -}}
{{- end -}}
{{- $cloudscale := deepCopy (default (dict) $cfg.cloudscale) -}}
{{- $_ := set $cloudscale "tokenFile" (printf "%s/token" (include "cloudscale-autoscaler.tokenDir" .)) -}}
{{- $_ = set $cfg "listen" (printf "0.0.0.0:%v" .Values.ports.grpc) -}}
{{- $_ = set $cfg "tls" $tls -}}
{{- $_ = set $cfg "cloudscale" $cloudscale -}}
{{- $_ = set $cfg "metrics" (dict "listen" (printf "0.0.0.0:%v" .Values.ports.metrics)) -}}
{{- with .Values.kubernetes -}}
{{- if .enabled -}}
{{- $election := dict "enabled" .leaderElection.enabled "leaseName" (include "cloudscale-autoscaler.fullname" $) "namespace" $.Release.Namespace "leaseDuration" .leaderElection.leaseDuration "renewDeadline" .leaderElection.renewDeadline "retryPeriod" .leaderElection.retryPeriod -}}
{{- $_ = set $election "journalConfigMap" (include "cloudscale-autoscaler.journal" $) -}}
{{- if .leaderElection.enabled -}}
{{- $_ = set $election "endpointSlice" (include "cloudscale-autoscaler.endpointSlice" $) -}}
{{- end -}}
{{- $_ = set $cfg "kubernetes" (dict "driftInterval" .driftInterval "driftTolerance" .driftTolerance "leaderElection" $election) -}}
{{- end -}}
{{- end -}}
{{- if not .Values.kubernetes.enabled -}}
{{- $_ = set $cfg "stateDir" (include "cloudscale-autoscaler.stateDir" .) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Whether the replicas elect a leader (and the leader routes the gRPC Service to itself). */}}
{{- define "cloudscale-autoscaler.elects" -}}
{{- if and .Values.kubernetes.enabled .Values.kubernetes.leaderElection.enabled -}}true{{- end -}}
{{- end -}}

{{/* More than one replica is safe only when the replicas elect a leader. */}}
{{- define "cloudscale-autoscaler.checkReplicas" -}}
{{- if and (gt (int .Values.replicas) 1) (not (and .Values.kubernetes.enabled .Values.kubernetes.leaderElection.enabled)) -}}
{{- fail (printf "replicas is %v: more than one replica needs kubernetes.enabled and kubernetes.leaderElection.enabled (two active providers would race on the same servers)" .Values.replicas) -}}
{{- end -}}
{{- end -}}

{{/*
What values.schema.json cannot say about the config (it relates values to each other; the
loader's CROSS_FIELD_RULES, cloudscale_autoscaler/config/schema.py), checked at render time so
that a mistake fails `helm install` instead of crash-looping the provider, which checks them
again at start: minSize <= maxSize; node group names, <name>-<zone> of `zones` included, used
once; server names `<cluster>-<group>-<8 characters>` within a host name's 63; a price for
every group's flavor; and the Lease's leaseDuration > renewDeadline > 1.2 x retryPeriod.
docs/deployment.md lists what only the provider checks.
*/}}
{{- define "cloudscale-autoscaler.checkNodeGroups" -}}
{{- $seen := dict -}}
{{- $cluster := toString .Values.config.cluster -}}
{{- $pricing := .Values.config.pricing -}}
{{- range $i, $group := .Values.config.nodeGroups -}}
{{- if gt (int $group.minSize) (int $group.maxSize) -}}
{{- fail (printf "config.nodeGroups[%d].minSize: %v is greater than maxSize (%v)" $i $group.minSize $group.maxSize) -}}
{{- end -}}
{{- $names := list $group.name -}}
{{- if $group.zones -}}
{{- $names = list -}}
{{- range $zone := $group.zones -}}
{{- $names = append $names (printf "%s-%s" $group.name $zone) -}}
{{- end -}}
{{- end -}}
{{- range $name := $names -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "config.nodeGroups[%d].name: node group %q is already made by config.nodeGroups[%v]" $i $name (get $seen $name)) -}}
{{- end -}}
{{- $_ := set $seen $name $i -}}
{{- $length := add (len $cluster) (len $name) 10 -}}
{{- if gt $length 63 -}}
{{- fail (printf "config.nodeGroups[%d].name: server names \"%s-%s-<8 chars>\" would be %d characters, more than the 63 a host name label allows; shorten config.cluster or the group name (together at most 53 characters)" $i $cluster $name $length) -}}
{{- end -}}
{{- end -}}
{{- if and (kindIs "map" $pricing) (kindIs "map" $pricing.flavorsPerHour) -}}
{{- if not (hasKey $pricing.flavorsPerHour $group.flavor) -}}
{{- fail (printf "config.pricing.flavorsPerHour: no price for flavor %q of config.nodeGroups[%d] (%q): CA's price expander would never choose that group" $group.flavor $i $group.name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- include "cloudscale-autoscaler.checkLease" . -}}
{{- end -}}

{{/* A Go duration ("1h30m", "500ms", "0") as seconds, for the checks above. */}}
{{- define "cloudscale-autoscaler.seconds" -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range $part := regexFindAll "[0-9.]+(ns|us|µs|μs|ms|s|m|h)" (toString .) -1 -}}
{{- $number := regexFind "^[0-9.]+" $part -}}
{{- $total = addf $total (mulf (float64 $number) (get $units (trimPrefix $number $part))) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/* client-go's rules for the Lease timings, as the provider checks them at start (the chart
writes them into the config whenever it has a `kubernetes` section). */}}
{{- define "cloudscale-autoscaler.checkLease" -}}
{{- if .Values.kubernetes.enabled -}}
{{- $election := .Values.kubernetes.leaderElection -}}
{{- $lease := float64 (include "cloudscale-autoscaler.seconds" $election.leaseDuration) -}}
{{- $renew := float64 (include "cloudscale-autoscaler.seconds" $election.renewDeadline) -}}
{{- $retry := float64 (include "cloudscale-autoscaler.seconds" $election.retryPeriod) -}}
{{- if le $lease $renew -}}
{{- fail (printf "kubernetes.leaderElection.leaseDuration: must be greater than renewDeadline (%v)" $election.renewDeadline) -}}
{{- end -}}
{{- if le $renew (mulf $retry 1.2) -}}
{{- fail (printf "kubernetes.leaderElection.renewDeadline: must be greater than 1.2 x retryPeriod (%v)" $election.retryPeriod) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The gRPC Service's EndpointSlice, which the leader points at itself. */}}
{{- define "cloudscale-autoscaler.endpointSlice" -}}
{{- include "cloudscale-autoscaler.fullname" . -}}
{{- end -}}

{{/* The ConfigMap holding the creation journal (creates in flight). */}}
{{- define "cloudscale-autoscaler.journal" -}}
{{- printf "%s-journal" (include "cloudscale-autoscaler.fullname" .) -}}
{{- end -}}

{{/* Where the creation journal's file lives without the kubernetes values (an emptyDir). */}}
{{- define "cloudscale-autoscaler.stateDir" -}}/var/lib/cloudscale-autoscaler{{- end -}}

{{/*
What the provider's account may change in its EndpointSlice: the endpoints, never the labels,
annotations, finalizers, owners or ports; at most one endpoint, one address of a Pod of the
slice's namespace, nothing but its address, ready condition and target. A token bound to a Pod
(every Pod's own, projected token) lists only that Pod, by name and uid; with podCIDRs, the
address is one of them. The same rules, without podCIDRs, are in
deploy/kustomize/base/leader-route.yaml.
*/}}
{{- define "cloudscale-autoscaler.routeValidations" -}}
- expression: object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({})
  message: the provider may not change its EndpointSlice's labels (they name its Service)
- expression: >-
    object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({}) &&
    object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([])
  message: the provider may not change its EndpointSlice's annotations or finalizers
- expression: >-
    object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([])
  message: the provider may not change its EndpointSlice's owners
- expression: object.?ports.orValue([]) == oldObject.?ports.orValue([])
  message: the provider may not change its EndpointSlice's ports
- expression: >-
    size(variables.endpoints) <= 1 &&
    variables.endpoints.all(e, size(e.addresses) == 1 && has(e.targetRef) &&
    e.targetRef.kind == "Pod" && e.targetRef.?namespace.orValue("") == object.metadata.namespace &&
    !has(e.hostname) && !has(e.nodeName) && !has(e.zone) && !has(e.hints) &&
    !has(e.deprecatedTopology))
  message: the provider's EndpointSlice lists at most one endpoint, one address of a Pod of its own namespace
- expression: >-
    !("authentication.kubernetes.io/pod-name" in variables.extra) ||
    variables.endpoints.all(e,
    e.targetRef.name == variables.extra["authentication.kubernetes.io/pod-name"][0] &&
    e.targetRef.?uid.orValue("") == variables.extra[?"authentication.kubernetes.io/pod-uid"].orValue([""])[0])
  message: a replica may list only its own Pod (the one its token is bound to)
{{- with .Values.kubernetes.leaderElection.podCIDRs }}
- expression: >-
    variables.endpoints.all(e, e.addresses.all(a,
    {{ toJson . }}.exists(c, cidr(c).containsIP(a))))
  message: the provider's endpoint is an address of the Pod network ({{ join ", " . }})
{{- end }}
{{- end -}}

{{/* The policy's variables: the endpoints written and the writer's token's extra fields. */}}
{{- define "cloudscale-autoscaler.routeVariables" -}}
- name: endpoints
  expression: object.?endpoints.orValue([])
- name: extra
  expression: request.userInfo.?extra.orValue({})
{{- end -}}
