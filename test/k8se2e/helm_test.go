package k8se2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestHelmInstall installs vpcni on the real node the other way operators
// do: `helm install` of deploy/helm/vpcni (helm from scripts/helm.sh),
// with values that say what writeOverlay's kustomize patches say. Then it
// proves the install as TestKubernetesNode proves kubectl apply -k (node
// Ready only with vpcni, 10 pods with consistent addresses, pod to pod,
// a Service, the legacy VM to pods), a `helm upgrade` that changes the
// agent's configuration rolls the DaemonSet (a new ConfigMap name) with
// every pod reachable from the legacy VM throughout and every allocation
// adopted, the metrics Services scraped from the legacy VM, and `helm
// uninstall` removes what the chart made but the CRDs and their objects.
// The release and every object live in vpcni-system, made beforehand with
// the Pod Security label, as the chart's README says.
func TestHelmInstall(t *testing.T) {
	n := upNode(t)
	helmBin := strings.TrimSpace(mustRun(t, nil, "bash", filepath.Join(repo, "scripts", "helm.sh")))
	// Helm's own cache and config away from the machine's.
	home := t.TempDir()
	helmEnv := []string{"HELM_CACHE_HOME=" + home + "/cache", "HELM_CONFIG_HOME=" + home + "/config", "HELM_DATA_HOME=" + home + "/data"}
	helm := func(args ...string) string {
		t.Helper()
		return mustRun(t, helmEnv, "nsenter", append([]string{"--net=/run/netns/" + nodeNS, "--", helmBin, "--kubeconfig", n.env["VPCNI_K8S_KUBECONFIG"]}, args...)...)
	}
	chart := filepath.Join(repo, "deploy", "helm", "vpcni")

	if n.nodeReady() {
		t.Fatal("the node is Ready before any CNI was installed")
	}
	n.mustKubectl("create", "namespace", "vpcni-system")
	n.mustKubectl("label", "namespace", "vpcni-system", "pod-security.kubernetes.io/enforce=privileged")
	installed := time.Now()
	helm("install", "vpcni", chart, "--namespace", "vpcni-system", "-f", n.writeValues(4))
	n.waitInstalled("helm install", installed)
	if out := helm("list", "--namespace", "vpcni-system", "-q"); strings.TrimSpace(out) != "vpcni" {
		t.Fatalf("helm list: %q, want the release vpcni", out)
	}

	web := n.runWeb()
	t.Run("addresses", func(t *testing.T) { checkAddresses(t, n, web) })
	t.Run("pod-to-pod", func(t *testing.T) { checkPodToPod(t, n, web) })
	t.Run("service", func(t *testing.T) { checkService(t, n, web) })
	t.Run("legacy-vm-to-pod", func(t *testing.T) { checkLegacyToPods(t, web[:3]) })
	t.Run("metrics-services", func(t *testing.T) { checkMetricsServices(t, n, helmMetricsPort) })
	t.Run("upgrade-rolls-agent", func(t *testing.T) { checkHelmUpgrade(t, n, helm, chart, web) })

	// Their DEL needs the agent: gone before it is.
	n.mustKubectl("delete", "deployment/web", "service/web", "--wait=true")
	eventually(t, 2*time.Minute, "the web pods gone", func() (bool, string) {
		ps := n.pods("default", "app=web")
		return len(ps) == 0, fmt.Sprintf("%d pods", len(ps))
	})
	// So must the controller's pods, which run on the pod network too: with
	// the agent gone their DEL fails and they would hold the namespace in
	// Terminating (the uninstall procedure in the chart's README).
	helm("upgrade", "vpcni", chart, "--namespace", "vpcni-system", "--reuse-values", "--set", "controller.replicas=0")
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 0, 2*time.Minute)
	// An object of vpcni's that must outlive the release (with the
	// controller gone, nothing deletes this reservation of a StatefulSet
	// that does not exist).
	keep := filepath.Join(t.TempDir(), "keep.yaml")
	if err := os.WriteFile(keep, []byte("apiVersion: vpcni.io/v1alpha1\nkind: AddressReservation\nmetadata: {name: vpcni-keep-0, namespace: default}\nspec: {statefulSet: vpcni-keep, ordinal: 0}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.mustKubectl("apply", "-f", keep)
	helm("uninstall", "vpcni", "--namespace", "vpcni-system", "--wait", "--timeout", "2m")
	for _, args := range [][]string{
		{"-n", "vpcni-system", "get", "daemonset", "vpcnid"},
		{"-n", "vpcni-system", "get", "service", "vpcni-agent-metrics"},
		{"get", "clusterrole", "vpcni-agent"},
		{"get", "mutatingwebhookconfiguration", "vpcni"},
	} {
		eventually(t, 2*time.Minute, "helm uninstall removes "+strings.Join(args, " "), func() (bool, string) {
			out, err := n.kubectl(args...)
			return err != nil && strings.Contains(out, "NotFound"), out
		})
	}
	// crds/: Helm installs them and never deletes them, nor what they hold.
	for _, args := range [][]string{
		{"get", "crd", "podaddresses.vpcni.io", "nodeblocks.vpcni.io", "addressreservations.vpcni.io"},
		{"-n", "default", "get", "addressreservation", "vpcni-keep-0"},
	} {
		if out, err := n.kubectl(args...); err != nil {
			t.Errorf("after helm uninstall: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Log("vpcni-test: helm uninstall removed the workloads, Services, RBAC and webhook; the CRDs and AddressReservation default/vpcni-keep-0 stay")
	// What the README says to run to remove the rest.
	n.mustKubectl("-n", "default", "delete", "addressreservation", "vpcni-keep-0")
	n.mustKubectl("delete", "crd", "podaddresses.vpcni.io", "nodeblocks.vpcni.io", "addressreservations.vpcni.io")
	n.mustKubectl("delete", "namespace", "vpcni-system", "--wait=true", "--timeout=2m")
}

// checkHelmUpgrade changes the pool's warmTarget with helm upgrade: the
// ConfigMap's name follows its content, so the DaemonSet rolls; the
// legacy VM probes a pod all the while, and the new agent adopts every
// allocation.
func checkHelmUpgrade(t *testing.T, n *node, helm func(...string) string, chart string, web []pod) {
	configMap := func() string {
		return strings.TrimSpace(n.mustKubectl("-n", "vpcni-system", "get", "daemonset", "vpcnid", "-o", "jsonpath={.spec.template.spec.volumes[?(@.name==\"config\")].configMap.name}"))
	}
	before, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	oldCM := configMap()
	oldAgent := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")[0].Metadata.Name

	target := netip.AddrPortFrom(netip.MustParseAddr(web[0].Status.PodIP), 8080)
	ok, failed := probeLegacy(target, func() {
		helm("upgrade", "vpcni", chart, "--namespace", "vpcni-system", "-f", n.writeValues(5))
		n.waitNewAgent(oldAgent)
	})
	if failed > 0 || ok == 0 {
		t.Errorf("legacy VM -> pod during the helm upgrade: %d ok, %d failed", ok, failed)
	}
	newCM := configMap()
	if newCM == oldCM {
		t.Errorf("helm upgrade with another warmTarget kept the ConfigMap %s", oldCM)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := n.getJSON(&cm, "-n", "vpcni-system", "get", "configmap", newCM); err != nil {
		t.Fatal(err)
	}
	var agentCfg struct {
		Pool struct {
			WarmTarget int `json:"warmTarget"`
		} `json:"pool"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["vpcnid.yaml"]), &agentCfg); err != nil || agentCfg.Pool.WarmTarget != 5 {
		t.Errorf("ConfigMap %s vpcnid.yaml: warmTarget %d (%v), want 5:\n%s", newCM, agentCfg.Pool.WarmTarget, err, cm.Data["vpcnid.yaml"])
	}
	after, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(held(before), held(after)) {
		t.Errorf("the upgraded agent holds other allocations:\nbefore %v\nafter  %v", held(before), held(after))
	}
	checkPodToPod(t, n, web)
	t.Logf("vpcni-test: helm upgrade (warmTarget 4 -> 5): ConfigMap %s -> %s, agent rolled, %d probes from the legacy VM, %d failed; %d allocations adopted", oldCM, newCM, ok, failed, len(after.Allocations))
}

// helmMetricsPort is the agent's metrics port in TestHelmInstall: not the
// default, so that the Service is seen to follow agent.config.metricsAddr.
const helmMetricsPort = 19695

// writeValues writes the chart's values that point vpcni at this node, as
// writeOverlayWith's patches do for kustomize: the image, this node's CNI
// dirs and host paths, the lab's subnet through the fault proxy (no
// Keystone: an endpoint, no credentials file), a small pool and SNAT, the
// controller's release grace and lease.
func (n *node) writeValues(warmTarget int) string {
	image, err := os.ReadFile(filepath.Join(binDir, "vpcni-image.name"))
	if err != nil {
		n.t.Fatal(err)
	}
	repoName, tag, _ := strings.Cut(strings.TrimSpace(string(image)), ":")
	values := map[string]any{
		"image": map[string]any{"repository": repoName, "tag": tag},
		"provider": map[string]any{"type": "openstack", "openstack": map[string]any{
			"endpoint": "http://" + proxyAddr + "/", "subnetID": n.lab.SubnetID, "maxAddresses": 64, "credentialsFile": nil}},
		"pool": map[string]any{"warmTarget": warmTarget, "batchSize": 4, "maxFree": 6, "surplusGrace": "8s", "addWait": "3s"},
		"agent": map[string]any{
			"config": map[string]any{
				"socketPath": "/run/vpcni/vpcnid.sock", "stateDir": "/var/lib/vpcni", "metricsAddr": fmt.Sprintf("${VPCNI_HOST_IP}:%d", helmMetricsPort),
				"cooldown":   "5s",
				"kubernetes": map[string]any{"mode": "on"},
				"snat":       map[string]any{"enabled": true, "vpcCIDRs": []string{"10.90.0.0/24"}},
			},
			"hostPaths": map[string]any{
				"cniBin": n.env["VPCNI_K8S_CNI_BIN_DIR"], "cniConf": n.env["VPCNI_K8S_CNI_CONF_DIR"],
				"socketDir": hostSocketDir, "stateDir": hostStateDir, "bpffs": hostBPFDir,
			},
		},
		"controller": map[string]any{"releaseGrace": "5s", "extraArgs": []string{"--lease-duration=6s"}},
	}
	data, err := yaml.Marshal(values)
	if err != nil {
		n.t.Fatal(err)
	}
	f := filepath.Join(n.t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		n.t.Fatal(err)
	}
	return f
}
