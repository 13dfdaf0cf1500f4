package blocks

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
)

// What the block mechanism relies on the API server for, checked on the
// real one with the generated CRD: one object per block (its name is the
// block; a second create fails), a name that is not its block and a CIDR
// with host bits refused, a spec that never changes, and a status write
// with a stale resourceVersion refused.
func TestNodeBlockAPIContract(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) })
	ctx := context.Background()
	c, err := nodeblocks.NewClient(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	nb := func(name, node, cidr string) *v1alpha1.NodeBlock {
		return &v1alpha1.NodeBlock{TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.NodeBlockKind},
			ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeBlockSpec{Node: node, CIDR: cidr}}
	}
	created, err := c.Create(ctx, nb("10.50.0.0-28", "api-1", "10.50.0.0/28"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, nb("10.50.0.0-28", "api-2", "10.50.0.0/28")); !apierrors.IsAlreadyExists(err) {
		t.Errorf("a second NodeBlock for the same block: %v, want AlreadyExists", err)
	}
	for _, bad := range []struct{ name, cidr, says string }{
		{"other-name", "10.50.0.16/28", "name is its CIDR"},
		{"10.50.0.17-28", "10.50.0.17/28", "without host bits"},
		{"10.50.0.16-28", "10.50.0.16", "CIDR"},
	} {
		_, err := c.Create(ctx, nb(bad.name, "api-2", bad.cidr))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("NodeBlock %s for %s: %v, want Invalid saying %q", bad.name, bad.cidr, err, bad.says)
		}
	}
	// The spec never changes: a block does not move to another node.
	moved := created.DeepCopy()
	moved.Spec.Node = "api-2"
	moved.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.NodeBlockKind}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(moved)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dyn(t).Resource(v1alpha1.NodeBlockResource).Update(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "never change") {
		t.Errorf("moving a block to another node: %v, want Invalid", err)
	}
	// Status: the first write with the read resourceVersion wins, a
	// second with the same (now stale) one is refused.
	st := created.DeepCopy()
	meta.SetStatusCondition(&st.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAssigned, Status: metav1.ConditionTrue, Reason: "Test", Message: "first"})
	if _, err := c.UpdateStatus(ctx, st); err != nil {
		t.Fatal(err)
	}
	meta.SetStatusCondition(&st.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: "Test", Message: "stale"})
	if _, err := c.UpdateStatus(ctx, st); !apierrors.IsConflict(err) {
		t.Errorf("a status write with a stale resourceVersion: %v, want Conflict", err)
	}
	got, err := c.Get(ctx, created.Name)
	if err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionAssigned); cond == nil || cond.Message != "first" {
		t.Errorf("stored condition %+v, want the first write's", cond)
	}
}
