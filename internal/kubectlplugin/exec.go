package kubectlplugin

import (
	"context"
	"errors"
	"fmt"
	"io"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"
)

// execVpcnictl runs vpcnictl with command in the pod's agent container
// and streams its stdout and stderr here. It returns vpcnictl's exit
// code; an error only when the command could not be run (or its stream
// broke).
func execVpcnictl(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, pod *corev1.Pod, command []string, stdout, stderr io.Writer) (int, error) {
	req := cs.CoreV1().RESTClient().Post().
		Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: AgentContainer,
			Command:   append([]string{vpcnictl}, command...),
			Stdout:    true,
			Stderr:    true,
		}, scheme.ParameterCodec)
	// WebSockets first (API servers take them by default since 1.30, and
	// proxies that know no SPDY pass them), SPDY when the upgrade is
	// refused (an older API server), as kubectl exec does.
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
	if err != nil {
		return 1, fmt.Errorf("exec in %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return 1, fmt.Errorf("exec in %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return 1, fmt.Errorf("exec in %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit) && exit.Exited():
		return exit.ExitStatus(), nil
	case isForbidden(err) || !mayExec(ctx, cs, pod.Namespace):
		return 1, fmt.Errorf("run vpcnictl in %s/%s: %w", pod.Namespace, pod.Name,
			forbiddenExec(err, pod.Namespace))
	default:
		return 1, fmt.Errorf("run vpcnictl in %s/%s (container %s, node %s): %w",
			pod.Namespace, pod.Name, AgentContainer, pod.Spec.NodeName, err)
	}
}

// mayExec asks the API server whether these credentials may create
// pods/exec in namespace: the SPDY upgrade's refusal arrives as a plain
// message, so after a failed exec this tells RBAC's no from a broken
// connection. When the question itself fails, the answer is yes: the
// exec's own error is then reported as it is.
func mayExec(ctx context.Context, cs kubernetes.Interface, namespace string) bool {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: "create", Resource: "pods", Subresource: "exec"}}}, metav1.CreateOptions{})
	return err != nil || r.Status.Allowed
}

// isForbidden recognises RBAC's refusal of an exec: the SPDY path returns
// the API server's Status as an error, the WebSocket one its reason in
// an upgrade failure.
func isForbidden(err error) bool {
	if apierrors.IsForbidden(err) {
		return true
	}
	var up *httpstream.UpgradeFailureError
	return errors.As(err, &up) && up.Cause != nil && apierrors.IsForbidden(up.Cause)
}

// forbiddenExec names the permission pods/exec needs.
func forbiddenExec(err error, namespace string) error {
	return fmt.Errorf("%w: create pods/exec in namespace %s is not allowed for your credentials (ask for an RBAC rule granting it; docs/kubectl-plugin.md lists what kubectl vpcni needs): %v",
		ErrForbidden, namespace, err)
}
