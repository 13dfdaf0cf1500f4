package k8se2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nodeRegistry is where the node's containerd finds a registry over plain
// HTTP (scripts/k8s-node.sh NODE_REGISTRY writes its hosts.toml).
const nodeRegistry = "127.0.0.1:5100"

// registryEnv runs scripts/registry.sh on the node's own loopback: inside
// the node's network namespace, as a cluster's registry is reached from a
// node, and out of reach of the machine's namespaces (and of test/release's
// registry on the machine's 127.0.0.1:5100). Its own state dir.
func registryEnv() []string {
	return []string{"VPCNI_REGISTRY_NETNS=" + nodeNS, "VPCNI_REGISTRY_ADDR=" + nodeRegistry, "VPCNI_REGISTRY_STATE=/var/tmp/vpcni-registry-node"}
}

// useRegistry starts the registry in the node's namespace and pushes this
// build's image and the previous release's (make image and make
// prev-image write their OCI archives beside the docker-save ones), each
// under its version tag, with crane. The node installs both by pulling from
// it from here on (n.ref), never by import.
func (n *node) useRegistry(t *testing.T) {
	t.Helper()
	script := filepath.Join(repo, "scripts/registry.sh")
	start := time.Now()
	mustRun(t, registryEnv(), "bash", script, "up")
	t.Cleanup(func() { _, _ = run(t, registryEnv(), "bash", script, "down") })
	n.registry = nodeRegistry
	images := []string{filepath.Join(binDir, "vpcni-image.oci.tar")}
	if prev := os.Getenv("VPCNI_PREV_IMAGE"); prev != "" {
		images = append(images, strings.TrimSuffix(prev, ".tar")+".oci.tar")
	}
	for _, archive := range images {
		name, err := os.ReadFile(filepath.Join(filepath.Dir(archive), "vpcni-image.name"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(archive); err != nil {
			t.Fatalf("no OCI image archive to push (make image, make prev-image write it): %v", err)
		}
		mustRun(t, registryEnv(), "bash", script, "push", archive, n.ref(strings.TrimSpace(string(name))))
	}
	t.Logf("vpcni-test: registry %s up in the node's namespace, %d images pushed with crane in %s", nodeRegistry, len(images), time.Since(start).Round(time.Millisecond))
}

// ref is the name the node installs image (vpcni/vpcni:TAG) as: from the
// node's registry when useRegistry ran, else as imported.
func (n *node) ref(image string) string {
	if n.registry == "" {
		return image
	}
	return n.registry + "/" + strings.TrimPrefix(image, "docker.io/")
}

// splitImage splits a reference into name and tag at the tag's colon (a
// registry's host:port has one too).
func splitImage(image string) (name, tag string) {
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return image, ""
	}
	return image[:i], image[i+1:]
}

// checkPulled fails unless the node's containerd holds image under its
// registry name: pulled, since nothing imports it under that name.
func checkPulled(t *testing.T, n *node, image string) {
	t.Helper()
	out := mustRun(t, nil, "bash", filepath.Join(repo, "scripts/k8s-node.sh"), "ctr", "images", "ls")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[0] == image && strings.HasPrefix(f[2], "sha256:") {
			fmt.Printf("registry: node pulled %s (%s)\n", image, f[2][:19])
			return
		}
	}
	t.Fatalf("the node's containerd has no %s pulled from the registry:\n%s", image, out)
}
