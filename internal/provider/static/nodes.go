package static

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ClusterNodes lists every Node's InternalIP and ExternalIP through rc
// (the agent's credentials: its ClusterRole may list nodes).
func ClusterNodes(rc *rest.Config) (func(ctx context.Context) ([]netip.Addr, error), error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("the Nodes' addresses: %w", err)
	}
	return func(ctx context.Context) ([]netip.Addr, error) {
		list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return nil, fmt.Errorf("list Nodes: %w", err)
		}
		var out []netip.Addr
		for _, n := range list.Items {
			for _, a := range n.Status.Addresses {
				if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
					continue
				}
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					out = append(out, ip.Unmap())
				}
			}
		}
		return out, nil
	}, nil
}
