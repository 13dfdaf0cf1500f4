// Package helm tests the Helm chart, deploy/helm/vpcni, against deploy/.
// The chart cannot render deploy/'s files themselves (it templates them), so
// two copies of the manifests exist; these tests keep them equal: `helm
// template` with the chart's defaults must give the objects `kubectl
// kustomize deploy/` gives, object by object and field by field, and the
// chart's values must land where they configure vpcni. Both tools are real:
// helm built by scripts/helm.sh, kubectl by scripts/k8s-node.sh build (both
// cached). No root, no cluster.
package helm

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

var (
	repo, _  = filepath.Abs("../..")
	chartDir = filepath.Join(repo, "deploy", "helm", "vpcni")
)

// configName is what the ConfigMap's hashed name is replaced with once its
// hash is checked, so that the two renders compare field by field.
const configName = "vpcni-config-<hash>"

// TestDefaultsRenderDeploy: the chart's defaults give deploy/'s objects.
func TestDefaultsRenderDeploy(t *testing.T) {
	want := deployObjects(t, kustomize(t, filepath.Join(repo, "deploy")))
	got := chartObjects(t, helmTemplate(t), "vpcni-system")
	if diffs := compare(got, want); len(diffs) > 0 {
		t.Fatalf("helm template deploy/helm/vpcni differs from kubectl kustomize deploy/ (change the chart with deploy/):\n%s", strings.Join(diffs, "\n"))
	}
	t.Logf("vpcni-test: helm template = kubectl kustomize deploy/: %d objects (%s)", len(want), strings.Join(slices.Sorted(maps.Keys(want)), ", "))
}

// TestBlocksRenderDeployBlocks: the chart with per-node blocks (the static
// provider's blocks mode and the controller's blockRanges) gives what
// deploy/ with its blocks component gives, turned on as deploy/'s
// kustomization.yaml says: the controller on the host network included.
func TestBlocksRenderDeployBlocks(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "deploy")
	if out, err := run("cp", "-r", filepath.Join(repo, "deploy"), dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	kfile := filepath.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(kfile)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, kfile, string(mustReplace(t, "kustomization.yaml", data, "# components:\n#   - blocks\n", "components:\n  - blocks\n")))
	want := deployObjects(t, kustomize(t, dir))
	values := filepath.Join(t.TempDir(), "values.yaml")
	writeFile(t, values, `provider:
  type: static
  static:
    ranges:
      - cidr: 10.20.0.0/22
        gateway: 10.20.0.1
        exclude: [10.20.0.2, 10.20.0.3]
    blocks: {wait: 10s}
controller:
  blockRanges: [10.20.0.0/22]
  blockSize: 26
`)
	got := chartObjects(t, helmTemplate(t, "-f", values), "vpcni-system")
	if diffs := compare(got, want); len(diffs) > 0 {
		t.Fatalf("helm template with blocks values differs from deploy/ with components: [blocks] (change the chart with deploy/blocks):\n%s", strings.Join(diffs, "\n"))
	}
	ctl := only(t, got, "Deployment", "vpcni-system/vpcni-controller")
	if dig(ctl, "spec", "template", "spec", "hostNetwork") != true {
		t.Errorf("blocks mode: the controller is not on the host network")
	}
	if dig(only(t, helmTemplate(t), "Deployment", "vpcni-system/vpcni-controller"), "spec", "template", "spec", "hostNetwork") != nil {
		t.Errorf("without blockRanges the controller must stay on the pod network")
	}
	t.Logf("vpcni-test: helm template (static provider, blockRanges) = kubectl kustomize deploy/ + blocks: %d objects, controller on the host network", len(want))
}

// TestDeployChangeIsCaught: a change to deploy/ alone is reported, naming
// the object and the field, so the chart cannot silently fall behind.
func TestDeployChangeIsCaught(t *testing.T) {
	dir := t.TempDir()
	files, err := os.ReadDir(filepath.Join(repo, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range files {
		if !e.Type().IsRegular() {
			continue // examples/, helm/: not part of the kustomization
		}
		f := e.Name()
		data, err := os.ReadFile(filepath.Join(repo, "deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		switch f {
		case "daemonset.yaml":
			data = mustReplace(t, f, data, "maxUnavailable: 1", "maxUnavailable: 2")
		case "vpcnid.yaml":
			data = mustReplace(t, f, data, "mode: fixed-ips", "mode: address-pairs")
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	diffs := compare(chartObjects(t, helmTemplate(t), "vpcni-system"), deployObjects(t, kustomize(t, dir)))
	for _, w := range []string{
		"DaemonSet vpcni-system/vpcnid: .spec.updateStrategy.rollingUpdate.maxUnavailable: chart 1, deploy/ 2",
		`ConfigMap vpcni-system/vpcni-config-<hash>: .data.vpcnid.yaml.provider.openstack.mode: chart "fixed-ips", deploy/ "address-pairs"`,
	} {
		if !slices.Contains(diffs, w) {
			t.Errorf("a change to deploy/ alone: want the difference %q, got:\n%s", w, strings.Join(diffs, "\n"))
		}
	}
	if len(diffs) != 2 {
		t.Errorf("want exactly the two planted differences, got %d:\n%s", len(diffs), strings.Join(diffs, "\n"))
	}
}

// TestValues: provider, datapath, pool, the secrets, the controller's flags,
// the image and the host paths each land where vpcni reads them.
func TestValues(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	cloudConfig := "openstack:\n  endpoint: http://neutron.example:9696/\nroutes:\n  routerID: r1\n"
	writeFile(t, values, `image: {repository: registry.example/vpcni, tag: v9, pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
provider:
  type: openstack
  openstack:
    subnetID: s1
    credentialsFile: null
    endpoint: http://neutron.example:9696/
    mode: address-pairs
    maxAddresses: 64
datapath: {mode: macvlan, macvlan: {serviceCIDRs: [10.96.0.0/12]}}
pool: {warmTarget: 4, addWait: 3s}
agent:
  config: {metricsAddr: "${VPCNI_HOST_IP}:19695"}
  hostPaths: {socketDir: /run/vpcni-other, cniBin: /opt/other/bin, bpffs: /run/other-bpffs}
  tolerations: [{key: dedicated, operator: Equal, value: cni, effect: NoSchedule}]
  nodeSelector: {kubernetes.io/os: linux}
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: pool, operator: In, values: [a]}]}]}}}
  priorityClassName: agent-prio
  extraEnv: [{name: HTTPS_PROXY, value: "http://proxy.example:3128"}]
cloudSecret: {create: false, name: my-cloud}
controller:
  replicas: 1
  releaseGrace: 5s
  blockRanges: [10.244.0.0/16, 10.245.0.0/16]
  blockSize: 24
  cloudConfig: |
`+indent(cloudConfig, "    ")+`  extraArgs: [--lease-duration=6s]
  tolerations: []
  nodeSelector: {node-role.kubernetes.io/control-plane: ""}
  affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: []}}
  priorityClassName: ""
  extraEnv: [{name: GODEBUG, value: "x=1"}]
`)
	objs := helmTemplate(t, "-f", values, "-n", "cni")

	cm := only(t, objs, "ConfigMap", "cni/"+configName)
	wantAgent := map[string]any{
		"socketPath":  "/run/vpcni/vpcnid.sock",
		"stateDir":    "/var/lib/vpcni",
		"metricsAddr": "${VPCNI_HOST_IP}:19695",
		"kubernetes":  map[string]any{"mode": "on"},
		"provider": map[string]any{"type": "openstack", "openstack": map[string]any{
			"subnetID": "s1", "endpoint": "http://neutron.example:9696/", "mode": "address-pairs", "maxAddresses": float64(64)}},
		"datapath": map[string]any{"mode": "macvlan", "macvlan": map[string]any{"serviceCIDRs": []any{"10.96.0.0/12"}}},
		"pool":     map[string]any{"warmTarget": float64(4), "addWait": "3s"},
	}
	if got := dig(cm, "data", "vpcnid.yaml"); !reflect.DeepEqual(got, wantAgent) {
		t.Errorf("vpcnid.yaml:\n got %s\nwant %s", js(got), js(wantAgent))
	}
	if got := dig(cm, "data", "10-vpcni.conflist", "plugins", 0, "socket"); got != "/run/vpcni-other/vpcnid.sock" {
		t.Errorf("conflist: vpcni's socket is %v, want the agent's socket in agent.hostPaths.socketDir", got)
	}

	ds := only(t, objs, "DaemonSet", "cni/vpcnid")
	vols := map[string]any{}
	for _, v := range dig(ds, "spec", "template", "spec", "volumes").([]any) {
		v := v.(map[string]any)
		vols[v["name"].(string)] = v
	}
	for name, want := range map[string]any{
		"config":     configName,
		"cloud":      "my-cloud",
		"cni-bin":    "/opt/other/bin",
		"socket-dir": "/run/vpcni-other",
		"cni-conf":   "/etc/cni/net.d",
		"bpffs":      "/run/other-bpffs",
	} {
		var got any
		switch name {
		case "config":
			got = dig(vols[name], "configMap", "name")
		case "cloud":
			got = dig(vols[name], "secret", "secretName")
		default:
			got = dig(vols[name], "hostPath", "path")
		}
		if got != want {
			t.Errorf("DaemonSet volume %s: %v, want %v", name, got, want)
		}
	}
	if _, ok := objs["Secret cni/my-cloud"]; ok {
		t.Errorf("cloudSecret.create false: the chart still renders Secret my-cloud")
	}
	if _, ok := objs["Secret cni/vpcni-cloud"]; ok {
		t.Errorf("cloudSecret.create false: the chart still renders Secret vpcni-cloud")
	}

	ctl := only(t, objs, "Deployment", "cni/vpcni-controller")
	wantCmd := []any{"/usr/local/bin/vpcni-controller", "--release-grace=5s",
		"--block-ranges=10.244.0.0/16,10.245.0.0/16", "--block-size=24",
		"--cloud-config=/etc/vpcni/cloud/cloud.yaml", "--lease-duration=6s"}
	if got := dig(ctl, "spec", "template", "spec", "containers", 0, "command"); !reflect.DeepEqual(got, wantCmd) {
		t.Errorf("controller command:\n got %v\nwant %v", got, wantCmd)
	}
	if got := dig(ctl, "spec", "replicas"); got != float64(1) {
		t.Errorf("controller replicas: %v, want 1", got)
	}
	if got := dig(ctl, "spec", "template", "spec", "volumes", 0, "secret", "secretName"); got != "vpcni-controller-cloud" {
		t.Errorf("controller: cloud volume from %v, want Secret vpcni-controller-cloud", got)
	}
	if got := dig(ctl, "spec", "template", "spec", "containers", 0, "volumeMounts", 0, "mountPath"); got != "/etc/vpcni/cloud" {
		t.Errorf("controller: cloud mounted at %v, want /etc/vpcni/cloud", got)
	}
	sum := sha256.Sum256([]byte(cloudConfig))
	if got := dig(ctl, "spec", "template", "metadata", "annotations", "vpcni.io/cloud-config-sha256"); got != hex.EncodeToString(sum[:]) {
		t.Errorf("controller: cloud-config-sha256 annotation %v, want the SHA-256 of cloudConfig (a change must roll it)", got)
	}
	if got := dig(only(t, objs, "Secret", "cni/vpcni-controller-cloud"), "stringData", "cloud.yaml"); got != cloudConfig {
		t.Errorf("Secret vpcni-controller-cloud cloud.yaml = %q, want %q", got, cloudConfig)
	}

	for _, p := range [][]any{
		{ds, "spec", "template", "spec", "initContainers", 0},
		{ds, "spec", "template", "spec", "containers", 0},
		{ctl, "spec", "template", "spec", "containers", 0},
	} {
		c := dig(p[0], p[1:]...)
		if dig(c, "image") != "registry.example/vpcni:v9" || dig(c, "imagePullPolicy") != "Always" {
			t.Errorf("container %v: image %v pull %v, want registry.example/vpcni:v9 Always", dig(c, "name"), dig(c, "image"), dig(c, "imagePullPolicy"))
		}
	}
	for _, k := range []string{"RoleBinding cni/vpcni-controller-leader", "ClusterRoleBinding /vpcni-agent", "ClusterRoleBinding /vpcni-controller"} {
		if got := dig(objs[k], "subjects", 0, "namespace"); got != "cni" {
			t.Errorf("%s: subject in namespace %v, want cni", k, got)
		}
	}
	if got := dig(objs["MutatingWebhookConfiguration /vpcni"], "webhooks", 0, "clientConfig", "service", "namespace"); got != "cni" {
		t.Errorf("webhook service namespace %v, want cni", got)
	}
	for k := range objs {
		if strings.HasPrefix(k, "Namespace ") {
			t.Errorf("the chart renders %s: every object goes in the release's namespace, which helm install --create-namespace makes", k)
		}
	}

	// Scheduling, environment and pull secrets: the agent's and the
	// controller's own.
	dsPod := dig(ds, "spec", "template", "spec")
	ctlPod := dig(ctl, "spec", "template", "spec")
	for _, c := range []struct {
		what      string
		got, want any
	}{
		{"agent tolerations", dig(dsPod, "tolerations"), []any{map[string]any{"key": "dedicated", "operator": "Equal", "value": "cni", "effect": "NoSchedule"}}},
		{"agent nodeSelector", dig(dsPod, "nodeSelector"), map[string]any{"kubernetes.io/os": "linux"}},
		{"agent affinity", dig(dsPod, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms", 0, "matchExpressions", 0, "key"), "pool"},
		{"agent priorityClassName", dig(dsPod, "priorityClassName"), "agent-prio"},
		{"agent extraEnv", dig(dsPod, "containers", 0, "env", 2), map[string]any{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"}},
		{"agent imagePullSecrets", dig(dsPod, "imagePullSecrets"), []any{map[string]any{"name": "regcred"}}},
		// tolerations: [] drops the defaults; with blockRanges the
		// controller is on the host network and must still run on a new
		// cluster's first node.
		{"controller tolerations", dig(ctlPod, "tolerations"), []any{
			map[string]any{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
			map[string]any{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"},
		}},
		{"controller nodeSelector", dig(ctlPod, "nodeSelector"), map[string]any{"node-role.kubernetes.io/control-plane": ""}},
		{"controller affinity", dig(ctlPod, "affinity"), map[string]any{"podAntiAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{}}}},
		{"controller priorityClassName", dig(ctlPod, "priorityClassName"), nil},
		{"controller extraEnv", dig(ctlPod, "containers", 0, "env", 2), map[string]any{"name": "GODEBUG", "value": "x=1"}},
		{"controller imagePullSecrets", dig(ctlPod, "imagePullSecrets"), []any{map[string]any{"name": "regcred"}}},
		// The Service follows metricsAddr's port.
		{"agent metrics Service port", dig(only(t, objs, "Service", "cni/vpcni-agent-metrics"), "spec", "ports", 0), map[string]any{"name": "metrics", "port": float64(19695), "targetPort": float64(19695)}},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s: %s, want %s", c.what, js(c.got), js(c.want))
		}
	}
	// The agent's metrics address comes from the node: VPCNI_HOST_IP.
	if got := dig(dsPod, "containers", 0, "env", 1); !reflect.DeepEqual(got, map[string]any{"name": "VPCNI_HOST_IP", "valueFrom": map[string]any{"fieldRef": map[string]any{"fieldPath": "status.hostIP"}}}) {
		t.Errorf("agent env[1]: %s, want VPCNI_HOST_IP from status.hostIP", js(got))
	}
}

// TestConflistName: agent.conflistName reaches vpcnid's --conflist-name;
// unset, the flag is left out (vpcnid's default, as deploy/ has it).
func TestConflistName(t *testing.T) {
	cmd := func(objs map[string]map[string]any) []any {
		return dig(only(t, objs, "DaemonSet", "vpcni-system/vpcnid"), "spec", "template", "spec", "containers", 0, "command").([]any)
	}
	if got := cmd(helmTemplate(t, "--set", "agent.conflistName=01-vpcni.conflist")); !slices.Contains(got, any("--conflist-name=01-vpcni.conflist")) {
		t.Errorf("agent.conflistName=01-vpcni.conflist: vpcnid's command %v", got)
	}
	for _, a := range cmd(helmTemplate(t)) {
		if strings.HasPrefix(a.(string), "--conflist-name") {
			t.Errorf("agent.conflistName unset: vpcnid's command has %s", a)
		}
	}
}

// TestStaticProvider: only the chosen provider's section reaches vpcnid.yaml.
func TestStaticProvider(t *testing.T) {
	objs := helmTemplate(t, "--set", "provider.type=static", "--set", "provider.static.ranges[0].cidr=10.20.0.0/22", "--set", "provider.static.blocks.wait=10s")
	cm := only(t, objs, "ConfigMap", "vpcni-system/"+configName)
	want := map[string]any{"type": "static", "static": map[string]any{
		"ranges": []any{map[string]any{"cidr": "10.20.0.0/22"}}, "blocks": map[string]any{"wait": "10s"}}}
	if got := dig(cm, "data", "vpcnid.yaml", "provider"); !reflect.DeepEqual(got, want) {
		t.Errorf("provider:\n got %s\nwant %s", js(got), js(want))
	}
}

// TestBadValues: a value the chart cannot use is refused, naming it
// (values.schema.json: helm refuses before rendering anything).
func TestBadValues(t *testing.T) {
	for _, c := range []struct {
		set, want string
	}{
		{"provider.type=aws", "at '/provider/type': value must be one of 'openstack', 'static'"},
		{"image.tag=", "at '/image/tag': minLength: got 0, want 1"},
		{"controller.replicas=two", "at '/controller/replicas': got string, want integer"},
		{"pool.addWait=soon", "at '/pool/addWait': 'oneOf' failed"},
		{"agent.tolerations[0].operator=Maybe", "at '/agent/tolerations/0/operator': value must be one of 'Exists', 'Equal'"},
		{"controller.blockRanges[0]=10.0.0.0", "at '/controller/blockRanges/0': '10.0.0.0' does not match pattern"},
		{"metrics.serviceMonitor.enabled=yes", "at '/metrics/serviceMonitor/enabled': got string, want boolean"},
		// A value the chart does not know: a typo, or one of an older chart
		// (namespace.name, namespace.create: now the release's namespace).
		{"namespace.name=cni", "additional properties 'namespace' not allowed"},
	} {
		out, err := helm("template", "vpcni", chartDir, "--set", c.set)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("--set %s: want an error saying %q, got %v:\n%s", c.set, c.want, err, out)
		}
	}
	// The same values the right way are accepted: the refusals above are
	// the schema's reading of those values, not of the chart.
	if out, err := helm("template", "vpcni", chartDir, "--set", "controller.replicas=3", "--set", "pool.addWait=5s", "--set", "agent.tolerations[0].operator=Exists",
		"--set", "controller.blockRanges[0]=10.0.0.0/16", "--set", "metrics.serviceMonitor.enabled=true"); err != nil {
		t.Errorf("good values refused: %v\n%s", err, out)
	}
}

// TestStandardLabels: every object the chart renders carries the standard
// labels, its pods too, and a selector reads only app.kubernetes.io/name
// (a selector cannot change once the object exists).
func TestStandardLabels(t *testing.T) {
	objs := helmTemplate(t, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.prometheusRule.enabled=true")
	chartObjects(t, objs, "vpcni-system") // checks and strips Helm's labels
	for k, o := range objs {
		if dig(o, "kind") == "CustomResourceDefinition" {
			continue
		}
		labels, _ := dig(o, "metadata", "labels").(map[string]any)
		name, component := labels["app.kubernetes.io/name"], labels["app.kubernetes.io/component"]
		want, ok := map[any]any{"vpcnid": "agent", "vpcni-controller": "controller", "vpcni": "monitoring"}[name]
		if !ok || component != want || labels["app.kubernetes.io/part-of"] != "vpcni" {
			t.Errorf("%s: labels %s, want app.kubernetes.io/name (vpcnid, vpcni-controller or vpcni), its component and part-of vpcni", k, js(labels))
		}
		for _, sel := range []any{dig(o, "spec", "selector", "matchLabels"), dig(o, "spec", "selector")} {
			if m, ok := sel.(map[string]any); ok && dig(o, "kind") != "ServiceMonitor" && dig(m, "matchLabels") == nil {
				if len(m) != 1 || m["app.kubernetes.io/name"] == nil {
					t.Errorf("%s: selector %s, want app.kubernetes.io/name alone", k, js(m))
				}
			}
		}
	}
}

// TestMonitoring: off by default; on, the ServiceMonitor selects both
// metrics Services by labels they have and scrapes their port, and the
// PrometheusRule holds deploy/prometheus/vpcni-alerts.yaml's groups.
func TestMonitoring(t *testing.T) {
	for k := range helmTemplate(t) {
		if strings.HasPrefix(k, "ServiceMonitor ") || strings.HasPrefix(k, "PrometheusRule ") {
			t.Errorf("defaults render %s: want none (metrics.*.enabled false)", k)
		}
	}
	objs := helmTemplate(t, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.interval=15s",
		"--set", "metrics.serviceMonitor.labels.release=prom", "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.prometheusRule.labels.release=prom")
	sm := only(t, objs, "ServiceMonitor", "vpcni-system/vpcni")
	if got := dig(sm, "metadata", "labels", "release"); got != "prom" {
		t.Errorf("ServiceMonitor label release = %v, want prom (metrics.serviceMonitor.labels)", got)
	}
	if got := dig(sm, "spec", "endpoints", 0, "interval"); got != "15s" {
		t.Errorf("ServiceMonitor interval %v, want 15s", got)
	}
	port := dig(sm, "spec", "endpoints", 0, "port")
	sel, _ := dig(sm, "spec", "selector", "matchLabels").(map[string]any)
	var selected []string
	for k, o := range objs {
		if dig(o, "kind") != "Service" || dig(o, "metadata", "namespace") != "vpcni-system" {
			continue
		}
		labels, _ := dig(o, "metadata", "labels").(map[string]any)
		match := len(sel) > 0
		for l, v := range sel {
			match = match && labels[l] == v
		}
		hasPort := slices.ContainsFunc(dig(o, "spec", "ports").([]any), func(p any) bool { return dig(p, "name") == port })
		if match && hasPort {
			selected = append(selected, k)
		}
	}
	slices.Sort(selected)
	if want := []string{"Service vpcni-system/vpcni-agent-metrics", "Service vpcni-system/vpcni-controller-metrics"}; !slices.Equal(selected, want) {
		t.Errorf("the ServiceMonitor (selector %s, port %v) scrapes %v, want %v", js(sel), port, selected, want)
	}

	rule := only(t, objs, "PrometheusRule", "vpcni-system/vpcni")
	if got := dig(rule, "metadata", "labels", "release"); got != "prom" {
		t.Errorf("PrometheusRule label release = %v, want prom (metrics.prometheusRule.labels)", got)
	}
	data, err := os.ReadFile(filepath.Join(repo, "deploy", "prometheus", "vpcni-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	if got := dig(rule, "spec", "groups"); !reflect.DeepEqual(got, file["groups"]) || len(file["groups"].([]any)) == 0 {
		t.Errorf("PrometheusRule groups differ from deploy/prometheus/vpcni-alerts.yaml's:\n got %s\nwant %s", js(got), js(file["groups"]))
	}
}

// ---- rendering

// helmOnlyLabels are the labels Helm's objects carry and kustomize's do
// not, with their values for release vpcni of the chart's defaults.
func helmOnlyLabels(t *testing.T) map[string]string {
	t.Helper()
	var chart struct{ Name, Version string }
	var values struct{ Image struct{ Tag string } }
	for f, v := range map[string]any{"Chart.yaml": &chart, "values.yaml": &values} {
		data, err := os.ReadFile(filepath.Join(chartDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return map[string]string{
		"app.kubernetes.io/instance":   "vpcni",
		"app.kubernetes.io/managed-by": "Helm",
		"app.kubernetes.io/version":    values.Image.Tag,
		"helm.sh/chart":                chart.Name + "-" + chart.Version,
	}
}

// chartObjects checks that every object of the chart (but its CRDs, which
// crds/ holds untemplated) and every pod template carry Helm's labels with
// the release's values, and strips them, so that what remains compares
// with deploy/. CRDs lose their labels: crds/ links deploy/'s generated
// files, to which only kustomize adds part-of.
func chartObjects(t *testing.T, objs map[string]map[string]any, ns string) map[string]map[string]any {
	t.Helper()
	helmLabels := helmOnlyLabels(t)
	for k, o := range objs {
		if dig(o, "kind") == "CustomResourceDefinition" {
			delete(o["metadata"].(map[string]any), "labels")
			continue
		}
		if n, ok := dig(o, "metadata", "namespace").(string); ok && n != ns {
			t.Errorf("%s: in namespace %s, want the release's, %s", k, n, ns)
		}
		for _, where := range [][]any{{"metadata", "labels"}, {"spec", "template", "metadata", "labels"}} {
			labels, ok := dig(o, where...).(map[string]any)
			if !ok {
				if where[0] == "metadata" {
					t.Errorf("%s: no labels", k)
				}
				continue
			}
			for l, want := range helmLabels {
				if got := labels[l]; got != want {
					t.Errorf("%s: .%s[%s] = %v, want %s", k, strings.Join(strings.Fields(fmt.Sprint(where...)), "."), l, got, want)
				}
				delete(labels, l)
			}
		}
	}
	return objs
}

// deployObjects leaves out deploy/'s Namespace (the chart's objects go in
// the release's namespace, which helm install --create-namespace makes),
// once it is checked to allow the agent's privileged pods, and the CRDs'
// labels (see chartObjects).
func deployObjects(t *testing.T, objs map[string]map[string]any) map[string]map[string]any {
	t.Helper()
	ns := only(t, objs, "Namespace", "/vpcni-system")
	if got := dig(ns, "metadata", "labels", "pod-security.kubernetes.io/enforce"); got != "privileged" {
		t.Errorf("deploy/namespace.yaml: pod-security.kubernetes.io/enforce %v, want privileged (the agent's init step)", got)
	}
	delete(objs, "Namespace /vpcni-system")
	for _, o := range objs {
		if dig(o, "kind") == "CustomResourceDefinition" {
			delete(o["metadata"].(map[string]any), "labels")
		}
	}
	return objs
}

// kustomize renders dir with the k8s-build kubectl.
func kustomize(t *testing.T, dir string) map[string]map[string]any {
	t.Helper()
	kubectl := filepath.Join(apiserver.K8sCache, apiserver.K8sVersion, "bin", "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("kubectl: %v (build it: bash scripts/k8s-node.sh build)", err)
	}
	out, err := run(kubectl, "kustomize", dir)
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
	return objects(t, "kubectl kustomize", out)
}

// helmTemplate renders the chart, CRDs included, as release vpcni in
// namespace vpcni-system (args may name another: the last -n wins).
func helmTemplate(t *testing.T, args ...string) map[string]map[string]any {
	t.Helper()
	out, err := helm(append([]string{"template", "vpcni", chartDir, "--include-crds", "-n", "vpcni-system"}, args...)...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return objects(t, "helm template", out)
}

// helm runs the binary scripts/helm.sh names (building it on first use);
// its output is stdout and stderr together.
func helm(args ...string) (string, error) {
	path, err := exec.Command("bash", filepath.Join(repo, "scripts", "helm.sh")).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(ee.Stderr), fmt.Errorf("scripts/helm.sh: %w", err)
		}
		return "", fmt.Errorf("scripts/helm.sh: %w", err)
	}
	return run(strings.TrimSpace(string(path)), args...)
}

func run(bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// objects parses a multi-document render into objects keyed by
// "Kind namespace/name", with the ConfigMap's payload parsed (vpcnid.yaml
// as YAML, the conflist as JSON: the chart writes them from values, so
// only their content can match) and its hashed name checked and replaced
// by configName wherever it appears.
func objects(t *testing.T, from, out string) map[string]map[string]any {
	t.Helper()
	objs := map[string]map[string]any{}
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(out)))
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", from, err)
		}
		var o map[string]any
		if err := yaml.Unmarshal(doc, &o); err != nil {
			t.Fatalf("%s: %v\n%s", from, err, doc)
		}
		if o == nil {
			continue // only comments
		}
		k := key(o)
		if _, dup := objs[k]; dup {
			t.Fatalf("%s: %s twice", from, k)
		}
		objs[k] = o
	}
	var cms []string
	for k, o := range objs {
		if dig(o, "kind") == "ConfigMap" && strings.HasPrefix(dig(o, "metadata", "name").(string), "vpcni-config-") {
			cms = append(cms, k)
		}
	}
	if len(cms) != 1 {
		t.Fatalf("%s: want one ConfigMap vpcni-config-<hash>, got %v", from, cms)
	}
	cm := objs[cms[0]]
	delete(objs, cms[0])
	name := dig(cm, "metadata", "name").(string)
	data, _ := cm["data"].(map[string]any)
	if want := "vpcni-config-" + configMapHash(t, data); name != want {
		t.Fatalf("%s: ConfigMap %s: want the name kustomize gives its content, %s", from, name, want)
	}
	for f, v := range data {
		s, _ := v.(string)
		var parsed any
		if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
			t.Fatalf("%s: ConfigMap %s: %s: %v", from, name, f, err)
		}
		data[f] = parsed
	}
	cm["metadata"].(map[string]any)["name"] = configName
	objs[key(cm)] = cm
	for k, o := range objs {
		objs[k] = replaceString(o, name, configName).(map[string]any)
	}
	return objs
}

// configMapHash is kustomize's configMapGenerator suffix
// (sigs.k8s.io/kustomize/api/hasher): the SHA-256 of the JSON of kind, name
// and data, its first ten hex digits with 0 1 3 a e mapped to g h k m t.
// The name is empty there: kustomize (api v0.21.1) looks it up as a single
// field called "metadata/name", which finds nothing.
// Checking both renders against it proves the chart's template computes
// the same thing: a changed configuration gets a new name and rolls the
// DaemonSet, with either tool.
func configMapHash(t *testing.T, data map[string]any) string {
	t.Helper()
	enc, err := json.Marshal(map[string]any{"kind": "ConfigMap", "name": "", "data": data})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(enc)
	return strings.NewReplacer("0", "g", "1", "h", "3", "k", "a", "m", "e", "t").Replace(hex.EncodeToString(sum[:])[:10])
}

func key(o map[string]any) string {
	ns, _ := dig(o, "metadata", "namespace").(string)
	return fmt.Sprintf("%v %s/%v", o["kind"], ns, dig(o, "metadata", "name"))
}

// ---- comparing

// compare lists every difference between the chart's objects and deploy/'s,
// one line per object missing on either side and per differing field.
func compare(chart, deploy map[string]map[string]any) []string {
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(deploy)) {
		if _, ok := chart[k]; !ok {
			diffs = append(diffs, k+": in deploy/, not rendered by the chart")
			continue
		}
		diffs = diffValues(diffs, k+": ", "", chart[k], deploy[k])
	}
	for _, k := range slices.Sorted(maps.Keys(chart)) {
		if _, ok := deploy[k]; !ok {
			diffs = append(diffs, k+": rendered by the chart, not in deploy/")
		}
	}
	return diffs
}

func diffValues(diffs []string, obj, path string, chart, deploy any) []string {
	cm, cok := chart.(map[string]any)
	dm, dok := deploy.(map[string]any)
	if cok && dok {
		keys := slices.Collect(maps.Keys(cm))
		for k := range dm {
			if _, ok := cm[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			diffs = diffValues(diffs, obj, path+"."+k, cm[k], dm[k])
		}
		return diffs
	}
	cl, cok := chart.([]any)
	dl, dok := deploy.([]any)
	if cok && dok && len(cl) == len(dl) {
		for i := range cl {
			diffs = diffValues(diffs, obj, fmt.Sprintf("%s[%d]", path, i), cl[i], dl[i])
		}
		return diffs
	}
	if !reflect.DeepEqual(chart, deploy) {
		diffs = append(diffs, fmt.Sprintf("%s%s: chart %s, deploy/ %s", obj, path, js(chart), js(deploy)))
	}
	return diffs
}

// ---- helpers

// dig walks maps by key and lists by index; nil where the path ends.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch p := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[p]
		case int:
			l, _ := v.([]any)
			if p >= len(l) {
				return nil
			}
			v = l[p]
		}
	}
	return v
}

func only(t *testing.T, objs map[string]map[string]any, kind, nsName string) map[string]any {
	t.Helper()
	o, ok := objs[kind+" "+nsName]
	if !ok {
		t.Fatalf("no %s %s rendered; have %v", kind, nsName, slices.Sorted(maps.Keys(objs)))
	}
	return o
}

func replaceString(v any, from, to string) any {
	switch v := v.(type) {
	case string:
		if v == from {
			return to
		}
	case map[string]any:
		for k, e := range v {
			v[k] = replaceString(e, from, to)
		}
	case []any:
		for i, e := range v {
			v[i] = replaceString(e, from, to)
		}
	}
	return v
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}

func mustReplace(t *testing.T, file string, data []byte, old, new string) []byte {
	t.Helper()
	if !bytes.Contains(data, []byte(old)) {
		t.Fatalf("deploy/%s has no %q to change", file, old)
	}
	return bytes.Replace(data, []byte(old), []byte(new), 1)
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
