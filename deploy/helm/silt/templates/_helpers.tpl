{{/*
Names: RELEASE-silt (or RELEASE when it already says silt), cut to 40 characters so that the
longest suffix (-etcd-peer, -csi-node) and a StatefulSet's pod ordinal stay within 63.
*/}}
{{- define "silt.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "silt.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "silt.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "silt.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "worker"). */}}
{{- define "silt.selector" -}}
app.kubernetes.io/name: {{ include "silt.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "silt.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "silt.secretName" -}}
{{- default (printf "%s-cluster-secret" (include "silt.fullname" .)) .Values.clusterSecret.existingSecret -}}
{{- end -}}

{{/* The etcd endpoints, comma-separated (the `etcd` option). */}}
{{- define "silt.etcdEndpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- printf "http://%s-etcd.%s.svc.%s:%d" (include "silt.fullname" .) .Release.Namespace .Values.clusterDomain (int .Values.etcd.clientPort) -}}
{{- else -}}
{{- if not .Values.etcd.endpoints -}}
{{- fail "etcd.enabled is false: give etcd.endpoints (e.g. [http://etcd.infra:2379])" -}}
{{- end -}}
{{- join "," .Values.etcd.endpoints -}}
{{- end -}}
{{- end -}}

{{/* The mount table, PATH=URI comma-separated (the `mounts` option). */}}
{{- define "silt.mounts" -}}
{{- $entries := list -}}
{{- range .Values.mounts -}}
{{- $entries = append $entries (printf "%s=%s" .path .uri) -}}
{{- end -}}
{{- join "," $entries -}}
{{- end -}}

{{/* The disk tiers, DIR:QUOTA comma-separated (the `disk_tiers` option), or none. */}}
{{- define "silt.diskTiers" -}}
{{- $tiers := list -}}
{{- range .Values.worker.disk -}}
{{- $tiers = append $tiers (printf "/silt/tiers/%s:%s" .name .quota) -}}
{{- end -}}
{{- if $tiers -}}{{ join "," $tiers }}{{- else -}}none{{- end -}}
{{- end -}}

{{/*
Environment every Silt process of the release shares: cluster, secret, under-stores, config.
*/}}
{{- define "silt.commonEnv" -}}
- name: SILT_ETCD
  value: {{ include "silt.etcdEndpoints" . | quote }}
- name: SILT_CLUSTER_NAME
  value: {{ .Values.clusterName | quote }}
- name: SILT_CLUSTER_SECRET_FILE
  value: /etc/silt/cluster/cluster-secret
- name: SILT_LOG
  value: {{ .Values.log | quote }}
{{- with .Values.s3.endpoint }}
- name: SILT_S3_ENDPOINT
  value: {{ . | quote }}
{{- end }}
- name: SILT_S3_REGION
  value: {{ .Values.s3.region | quote }}
- name: SILT_S3_PATH_STYLE
  value: {{ .Values.s3.pathStyle | quote }}
{{- if .Values.s3.existingSecret }}
- name: SILT_S3_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: {{ .Values.s3.accessKeyIdKey }}
- name: SILT_S3_SECRET_ACCESS_KEY_FILE
  value: /etc/silt/s3/secret-access-key
{{- end }}
{{- if .Values.config }}
- name: SILT_CONFIG
  value: /etc/silt/config/silt.toml
{{- end }}
{{- end -}}

{{/* Volume mounts matching silt.commonVolumes. */}}
{{- define "silt.commonVolumeMounts" -}}
- name: cluster-secret
  mountPath: /etc/silt/cluster
  readOnly: true
{{- if .Values.s3.existingSecret }}
- name: s3-secret
  mountPath: /etc/silt/s3
  readOnly: true
{{- end }}
{{- if .Values.config }}
- name: config
  mountPath: /etc/silt/config
  readOnly: true
{{- end }}
{{- end -}}

{{/* Secrets as owner-only files (Silt warns about secret files others may read). */}}
{{- define "silt.commonVolumes" -}}
- name: cluster-secret
  secret:
    secretName: {{ include "silt.secretName" . }}
    defaultMode: 0400
    items:
      - key: {{ .Values.clusterSecret.key }}
        path: cluster-secret
{{- if .Values.s3.existingSecret }}
- name: s3-secret
  secret:
    secretName: {{ .Values.s3.existingSecret }}
    defaultMode: 0400
    items:
      - key: {{ .Values.s3.secretAccessKeyKey }}
        path: secret-access-key
{{- end }}
{{- if .Values.config }}
- name: config
  configMap:
    name: {{ include "silt.fullname" . }}-config
{{- end }}
{{- end -}}

{{/* A container that needs no privilege: no capabilities, read-only root. */}}
{{- define "silt.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
