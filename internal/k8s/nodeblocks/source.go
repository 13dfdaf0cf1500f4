package nodeblocks

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/family"
)

// Source is one node's blocks as its agent sees them: a cache of the
// NodeBlocks (every node's: what the others hold bounds what this node
// may still get), and the way to ask for more (the Node's
// vpcni.io/blocks-wanted and vpcni.io/blocks-wanted-ipv6 annotations,
// which only vpcni-controller acts on).
// The agent never creates or deletes a NodeBlock itself.
type Source struct {
	node  string
	cs    kubernetes.Interface
	inf   cache.SharedIndexInformer
	wantM sync.Mutex // one Want at a time: read, compare, patch

	mu      sync.Mutex
	changed chan struct{} // closed (and replaced) on every change of the cache
}

// NewSource connects to the cluster of cfg for node; Start runs it.
func NewSource(cfg *rest.Config, node string) (*Source, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "vpcnid/" + node
	c, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	s := &Source{node: node, cs: cs, changed: make(chan struct{})}
	s.inf = c.Informer("", 0, nil)
	wake := func(any) { s.wake() }
	_, _ = s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: wake, UpdateFunc: func(_, o any) { wake(o) }, DeleteFunc: wake})
	return s, nil
}

// StartUntil runs the cache until ctx ends and waits until it has listed
// the node's blocks once, or listed ends.
func (s *Source) StartUntil(ctx, listed context.Context) error {
	go s.inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(listed.Done(), s.inf.HasSynced) {
		return fmt.Errorf("NodeBlocks of node %s not listed: %w", s.node, listed.Err())
	}
	return nil
}

func (s *Source) wake() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// Blocks lists the node's blocks, in address order. A NodeBlock being
// deleted or with no valid CIDR is not one of them.
func (s *Source) Blocks() []netip.Prefix { return s.list(true) }

// Taken lists the other nodes' blocks, in address order.
func (s *Source) Taken() []netip.Prefix { return s.list(false) }

func (s *Source) list(mine bool) []netip.Prefix {
	var out []netip.Prefix
	for _, obj := range s.inf.GetStore().List() {
		nb, ok := obj.(*v1alpha1.NodeBlock)
		if !ok || (nb.Spec.Node == s.node) != mine || mine && nb.DeletionTimestamp != nil {
			continue
		}
		if p, err := netip.ParsePrefix(nb.Spec.CIDR); err == nil && p.Masked() == p {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out
}

// BlocksOf lists the node's blocks of family f, in address order.
func (s *Source) BlocksOf(f family.Family) []netip.Prefix {
	return slices.DeleteFunc(s.Blocks(), func(b netip.Prefix) bool { return family.Of(b.Addr()) != f })
}

// WantedKey is the Node annotation that asks for blocks of family f.
func WantedKey(f family.Family) string {
	if f == family.V6 {
		return v1alpha1.AnnotationBlocksWantedIPv6
	}
	return v1alpha1.AnnotationBlocksWantedIPv4
}

// Want asks for n blocks of family f in all: it raises the Node's
// vpcni.io/blocks-wanted-ipv4 or -ipv6 to n and, when the node's blocks
// are of that family alone, vpcni.io/blocks-wanted too (which
// controllers of one family read, those from before per-family counts
// among them); it never lowers them (a live node keeps its blocks; asking
// for fewer would mean nothing).
func (s *Source) Want(ctx context.Context, f family.Family, n int, alone bool) error {
	s.wantM.Lock()
	defer s.wantM.Unlock()
	keys := []string{WantedKey(f)}
	if alone {
		keys = append(keys, v1alpha1.AnnotationBlocksWanted)
	}
	node, err := s.cs.CoreV1().Nodes().Get(ctx, s.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("node %s has no Node object: blocks are given to registered nodes only: %w", s.node, err)
	}
	if err != nil {
		return fmt.Errorf("read node %s: %w", s.node, err)
	}
	raise := map[string]string{}
	for _, k := range keys {
		if cur, err := strconv.Atoi(node.Annotations[k]); err != nil || cur < n {
			raise[k] = strconv.Itoa(n)
		}
	}
	if len(raise) == 0 {
		return nil
	}
	// The resourceVersion in the patch makes it conditional: a racing
	// writer's change to the annotation is not overwritten unseen.
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": node.ResourceVersion,
		"annotations":     raise}})
	if _, err := s.cs.CoreV1().Nodes().Patch(ctx, s.node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("ask for %d %s blocks on node %s: %w", n, f, s.node, err)
	}
	return nil
}

// WaitFor waits until the node has at least n blocks of family f, or ctx
// ends, and returns its blocks of f then.
func (s *Source) WaitFor(ctx context.Context, f family.Family, n int) []netip.Prefix {
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if b := s.BlocksOf(f); len(b) >= n {
			return b
		}
		select {
		case <-ctx.Done():
			return s.BlocksOf(f)
		case <-ch:
		}
	}
}
