{{/*
Names are fixed, as in deploy/: one agent per node listens on the node's port, so a cluster runs one
release of this chart.
*/}}

{{/* repository:tag, or repository@sha256:... for a digest */}}
{{- define "gpu-exporter.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{ .Values.image.repository }}{{ ternary "@" ":" (hasPrefix "sha256:" $tag) }}{{ $tag }}
{{- end }}

{{/* Labels of every object: the project's name plus Helm's own. Selectors use the name only. */}}
{{- define "gpu-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
The vendor's node-affinity terms, ORed, each an Exists (label values vary): deploy/base/daemonset.yaml's
for NVIDIA (PCIe and Jetson), deploy/components/amd's for AMD.
*/}}
{{- define "gpu-exporter.vendorTerms" -}}
{{- /* every term names the architectures of the image's manifest list (kubernetes.io/arch) */}}
{{- if eq .Values.agent.vendor "amd" }}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/amd-gpu, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/amd-vgpu, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: amd.com/gpu.family, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/pci-1002.present, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/pci-0300_1002.present, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/pci-0380_1002.present, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/pci-1200_1002.present, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: accelerator, operator: In, values: ["amd"]}
{{- else }}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: nvidia.com/gpu.present, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: nvidia.com/gpu.family, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/pci-10de.present, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/pci-0300_10de.present, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: feature.node.kubernetes.io/pci-0302_10de.present, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [arm64]}
    - {key: feature.node.kubernetes.io/nvidia-jetson, operator: Exists}
- matchExpressions:
    - {key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}
    - {key: accelerator, operator: Exists}
    - {key: accelerator, operator: NotIn, values: ["amd"]}
{{- end }}
{{- with .Values.agent.extraNodeSelectorTerms }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* config.yaml: the placement's and forwarding's settings, then agent.config over them. */}}
{{- define "gpu-exporter.config" -}}
{{- $a := .Values.agent }}
{{- $f := .Values.forwarding }}
{{- $c := dict "gpu-vendor" "auto" "gpu-metrics-collection-interval" "5s" "log.format" "json" }}
{{- $_ := set $c "web.listen-address" (printf ":%d" (int $a.port)) }}
{{- $_ = set $c "path.procfs" "/host/proc" }}
{{- $_ = set $c "k8s.pod-attribution" true }}
{{- $_ = set $c "k8s.pod-logs-path" "/var/log/pods" }}
{{- if eq $a.placement "kubernetes" }}
{{- $_ = set $c "k8s.kubelet-socket" "/var/lib/kubelet/pod-resources/kubelet.sock" }}
{{- end }}
{{- if $f.enabled }}
{{- $_ = set $c "mqtt.url" $f.url }}
{{- $_ = set $c "spool.max-bytes" $f.spool.maxBytes }}
{{- $_ = set $c "spool.max-age" $f.spool.maxAge }}
{{- if $f.nodeCredentials.enabled }}
{{- range $option, $file := dict "mqtt.tls.ca-file" $f.nodeCredentials.caFile "mqtt.tls.cert-file" $f.nodeCredentials.certFile "mqtt.tls.key-file" $f.nodeCredentials.keyFile }}
{{- if $file }}
{{- $_ = set $c $option (printf "/etc/gpu-exporter-node/%s" $file) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $f.secret.usePassword }}
{{- $_ = set $c "mqtt.password-file" "/etc/gpu-exporter-mqtt/password" }}
{{- end }}
{{- end }}
{{- toYaml (mergeOverwrite $c $a.config) }}
{{- end }}
