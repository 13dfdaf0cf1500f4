package kubectlplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// finder looks up the agent pods of one vpcni install.
type finder struct {
	cs        kubernetes.Interface
	namespace string
	selector  string
}

// Errors a lookup ends with, for callers (and tests) to tell apart; the
// message around them says what to do.
var (
	ErrNoNode      = errors.New("no such node")
	ErrNoAgent     = errors.New("no vpcni agent pod")
	ErrNotRunning  = errors.New("agent not running")
	ErrPodUnplaced = errors.New("pod not scheduled")
	ErrNoSuchPod   = errors.New("no such pod")
	ErrForbidden   = errors.New("forbidden by RBAC")
)

// forbidden wraps an API error that RBAC refused with what the user must
// be granted: verb on resource (in namespace, if any).
func forbidden(err error, verb, resource, namespace string) error {
	if !apierrors.IsForbidden(err) {
		return err
	}
	where := "cluster-wide"
	if namespace != "" {
		where = "in namespace " + namespace
	}
	return fmt.Errorf("%w: %s %s %s is not allowed for your credentials (ask for an RBAC rule granting it; docs/kubectl-plugin.md lists what kubectl vpcni needs): %v",
		ErrForbidden, verb, resource, where, err)
}

// nodeOfPod is the node a pod (NAMESPACE/NAME) runs on.
func (f finder) nodeOfPod(ctx context.Context, nsName string) (string, error) {
	ns, name, err := splitPod(nsName)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	pod, err := f.cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("%w: pod %s not found (kubectl get pods -n %s lists them)", ErrNoSuchPod, nsName, ns)
	case err != nil:
		return "", fmt.Errorf("get pod %s: %w", nsName, forbidden(err, "get", "pods", ns))
	case pod.Spec.NodeName == "":
		return "", fmt.Errorf("%w: pod %s is not on a node yet (phase %s): kubectl describe pod -n %s %s says why",
			ErrPodUnplaced, nsName, pod.Status.Phase, ns, name)
	}
	return pod.Spec.NodeName, nil
}

// agentOn finds the running agent pod on node, or says why there is none.
func (f finder) agentOn(ctx context.Context, node string) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	list, err := f.cs.CoreV1().Pods(f.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: f.selector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list the agent pods: %w", forbidden(err, "list", "pods", f.namespace))
	}
	if len(list.Items) == 0 {
		return nil, f.whyNoAgent(ctx, node)
	}
	pod := pickAgent(list.Items)
	if err := agentRunning(pod); err != nil {
		return nil, fmt.Errorf("%w (kubectl -n %s describe pod %s; kubectl -n %s logs %s -c %s)",
			err, pod.Namespace, pod.Name, pod.Namespace, pod.Name, AgentContainer)
	}
	return pod, nil
}

// whyNoAgent explains an empty list of agent pods on node: no such node,
// a node the DaemonSet does not cover, or no vpcni in this namespace
// (and where it is, if the credentials may look).
func (f finder) whyNoAgent(ctx context.Context, node string) error {
	if _, err := f.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: node %q not found (kubectl get nodes, or kubectl vpcni nodes, lists them)", ErrNoNode, node)
	}
	all, err := f.cs.CoreV1().Pods(f.namespace).List(ctx, metav1.ListOptions{LabelSelector: f.selector})
	if err == nil && len(all.Items) > 0 {
		return fmt.Errorf("%w on node %s: the DaemonSet has %d pods in namespace %s, none there (does the node match its nodeSelector and tolerations? kubectl -n %s describe daemonset)",
			ErrNoAgent, node, len(all.Items), f.namespace, f.namespace)
	}
	elsewhere := f.namespacesWithAgents(ctx)
	if len(elsewhere) > 0 {
		return fmt.Errorf("%w in namespace %s (selector %s): vpcni's agents run in namespace %s; pass -n %s",
			ErrNoAgent, f.namespace, f.selector, strings.Join(elsewhere, ", "), elsewhere[0])
	}
	return fmt.Errorf("%w in namespace %s (selector %s): is vpcni installed, and in this namespace? (-n NAMESPACE; kubectl get daemonsets -A -l %s)",
		ErrNoAgent, f.namespace, f.selector, f.selector)
}

// namespacesWithAgents are the namespaces with pods of the selector, when
// the credentials may list pods cluster-wide (else none).
func (f finder) namespacesWithAgents(ctx context.Context) []string {
	list, err := f.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: f.selector})
	if err != nil {
		return nil
	}
	var nss []string
	for _, p := range list.Items {
		if !slices.Contains(nss, p.Namespace) {
			nss = append(nss, p.Namespace)
		}
	}
	slices.Sort(nss)
	return nss
}

// pickAgent chooses among the agent pods on one node: during a rolling
// update the old pod may still be terminating beside the new one. A pod
// not being deleted comes first, then one whose agent container runs,
// then the newest.
func pickAgent(pods []corev1.Pod) *corev1.Pod {
	rank := func(p *corev1.Pod) int {
		r := 0
		if p.DeletionTimestamp == nil {
			r += 2
		}
		if containerRunning(p) {
			r++
		}
		return r
	}
	best := &pods[0]
	for i := range pods[1:] {
		p := &pods[i+1]
		if rp, rb := rank(p), rank(best); rp > rb || rp == rb && best.CreationTimestamp.Before(&p.CreationTimestamp) {
			best = p
		}
	}
	return best
}

// containerRunning says whether the pod's agent container runs.
func containerRunning(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == AgentContainer {
			return cs.State.Running != nil
		}
	}
	return false
}

// agentRunning is nil when vpcnictl can run in the pod's agent container,
// else what keeps it from running. A running agent that is not Ready is
// fine: status and doctor are what one runs then.
func agentRunning(p *corev1.Pod) error {
	if !slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == AgentContainer }) {
		return fmt.Errorf("%w: pod %s/%s on node %s has no container %q: is it vpcni's agent? (--selector)",
			ErrNotRunning, p.Namespace, p.Name, p.Spec.NodeName, AgentContainer)
	}
	if p.Status.Phase == corev1.PodRunning && containerRunning(p) {
		return nil
	}
	state := "not started"
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != AgentContainer {
			continue
		}
		switch {
		case cs.State.Waiting != nil:
			state = "waiting: " + cs.State.Waiting.Reason
			if m := cs.State.Waiting.Message; m != "" {
				state += ": " + m
			}
		case cs.State.Terminated != nil:
			state = fmt.Sprintf("terminated: %s (exit code %d)", cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		case cs.State.Running != nil:
			state = "running"
		}
	}
	return fmt.Errorf("%w: agent pod %s/%s on node %s is %s, container %s %s",
		ErrNotRunning, p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, AgentContainer, state)
}
