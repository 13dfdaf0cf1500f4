package kubectlplugin

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcni/vpcni/internal/ctl"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want options // compared: namespace, node, pod, command
		err  string  // a usage error containing this
	}{
		{args: []string{"--node", "n1", "status"},
			want: options{namespace: "vpcni-system", node: "n1", command: []string{"status"}}},
		// What follows the command is vpcnictl's, flags included.
		{args: []string{"--node=n1", "-n", "kube-system", "status", "-o", "json"},
			want: options{namespace: "kube-system", node: "n1", command: []string{"status", "-o", "json"}}},
		{args: []string{"--namespace", "vpcni", "--node", "n1", "doctor", "--cni-conf-dir", "/x"},
			want: options{namespace: "vpcni", node: "n1", command: []string{"doctor", "--cni-conf-dir", "/x"}}},
		// trace NS/POD names its node: the pod's.
		{args: []string{"trace", "default/web-1", "-o", "json"},
			want: options{namespace: "vpcni-system", pod: "default/web-1", command: []string{"trace", "default/web-1", "-o", "json"}}},
		{args: []string{"trace", "-o", "json", "default/web-1"},
			want: options{namespace: "vpcni-system", pod: "default/web-1", command: []string{"trace", "-o", "json", "default/web-1"}}},
		// --pod and a trace without a pod: that pod is traced.
		{args: []string{"--pod", "default/web-1", "trace", "-o", "json"},
			want: options{namespace: "vpcni-system", pod: "default/web-1", command: []string{"trace", "default/web-1", "-o", "json"}}},
		// --node and trace NS/POD: the given node (trace then says if the pod is not there).
		{args: []string{"--node", "n2", "trace", "default/web-1"},
			want: options{namespace: "vpcni-system", node: "n2", command: []string{"trace", "default/web-1"}}},
		// A flag's value with a "/" is no pod.
		{args: []string{"trace", "--socket", "/run/x/vpcnid.sock", "default/web-1"},
			want: options{namespace: "vpcni-system", pod: "default/web-1", command: []string{"trace", "--socket", "/run/x/vpcnid.sock", "default/web-1"}}},
		{args: []string{"trace", "--socket=/run/x.sock", "-o", "json", "--", "default/web-1"},
			want: options{namespace: "vpcni-system", pod: "default/web-1", command: []string{"trace", "--socket=/run/x.sock", "-o", "json", "--", "default/web-1"}}},
		{args: []string{"--pod", "default/web-1", "status"},
			want: options{namespace: "vpcni-system", pod: "default/web-1", command: []string{"status"}}},
		{args: []string{"nodes", "-o", "json"},
			want: options{namespace: "vpcni-system", command: []string{"nodes", "-o", "json"}}},
		{args: []string{"version"}, want: options{namespace: "vpcni-system", command: []string{"version"}}},

		{args: nil, err: "no command"},
		{args: []string{"--node", "n1"}, err: "no command"},
		{args: []string{"status"}, err: "status: which node?"},
		{args: []string{"doctor"}, err: "doctor: which node?"},
		{args: []string{"trace", "-o", "json"}, err: "trace: which node?"},
		{args: []string{"trace", "--socket", "/run/x/vpcnid.sock"}, err: "trace: which node?"},
		{args: []string{"doctor", "--cni-conf-dir", "etc/cni"}, err: "doctor: which node?"},
		{args: []string{"--node", "n1", "--pod", "a/b", "status"}, err: "--node and --pod both given"},
		{args: []string{"--pod", "web-1", "status"}, err: `--pod: "web-1" is not NAMESPACE/POD`},
		{args: []string{"--pod", "a/b/c", "status"}, err: "is not NAMESPACE/POD"},
		{args: []string{"--node", "n1", "nodes"}, err: "takes no --node or --pod"},
		{args: []string{"--node", "n1", "lab", "up"}, err: `unknown command "lab"`},
		{args: []string{"--node", "n1", "bench", "cni"}, err: `unknown command "bench"`},
		{args: []string{"--nod", "n1", "status"}, err: "flag provided but not defined: -nod"},
		{args: []string{"--node"}, err: "flag needs an argument"},
	} {
		name := strings.Join(tc.args, " ")
		got, err := parseArgs(tc.args, new(bytes.Buffer))
		if tc.err != "" {
			var ue usageError
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want a usage error saying %q", name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", name, err)
			continue
		}
		if got.namespace != tc.want.namespace || got.node != tc.want.node || got.pod != tc.want.pod || !slices.Equal(got.command, tc.want.command) {
			t.Errorf("%q: namespace %q node %q pod %q command %q; want %q %q %q %q", name,
				got.namespace, got.node, got.pod, got.command, tc.want.namespace, tc.want.node, tc.want.pod, tc.want.command)
		}
		if got.selector != DefaultSelector {
			t.Errorf("%q: selector %q", name, got.selector)
		}
	}
}

func TestMainExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"help"}, 0, "kubectl vpcni [flags] --node NODE status", ""},
		{[]string{"-h"}, 0, "", "kubectl vpcni [flags] --node NODE status"},
		{[]string{"version"}, 0, "kubectl-vpcni v9.9.9", ""},
		{nil, 2, "", "kubectl-vpcni: no command"},
		{[]string{"--node", "n1", "demo"}, 2, "", `unknown command "demo"`},
		// No cluster to reach: the kubeconfig named is not there.
		{[]string{"--kubeconfig", "/nonexistent/kubeconfig", "--node", "n1", "status"}, 1, "", "kubectl-vpcni: kubeconfig:"},
	} {
		var out, errOut bytes.Buffer
		code := Main("v9.9.9", tc.args, &out, &errOut)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errOut.String(), tc.stderr) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.args, code, out.String(), errOut.String(), tc.code, tc.stdout, tc.stderr)
		}
	}
}

// agentPod is an agent pod on node in the given state.
func agentPod(name, node string, created time.Time, running, deleting bool) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "vpcni-system", CreationTimestamp: metav1.NewTime(created)},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: AgentContainer}}}}
	if deleting {
		now := metav1.NewTime(created.Add(time.Hour))
		p.DeletionTimestamp = &now
	}
	st := corev1.ContainerStatus{Name: AgentContainer}
	if running {
		p.Status.Phase = corev1.PodRunning
		st.State.Running = &corev1.ContainerStateRunning{}
		st.Ready = true
	} else {
		p.Status.Phase = corev1.PodPending
		st.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s"}
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{st}
	return p
}

func TestPickAgent(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	old := agentPod("vpcnid-old", "n1", t0, true, true)
	newUp := agentPod("vpcnid-new", "n1", t0.Add(time.Minute), true, false)
	newDown := agentPod("vpcnid-new", "n1", t0.Add(time.Minute), false, false)
	older := agentPod("vpcnid-older", "n1", t0.Add(-time.Minute), true, false)
	for _, tc := range []struct {
		what string
		pods []corev1.Pod
		want string
	}{
		{"one pod", []corev1.Pod{newUp}, "vpcnid-new"},
		{"rolling update: the terminating old pod and the running new one", []corev1.Pod{old, newUp}, "vpcnid-new"},
		{"the same, other order", []corev1.Pod{newUp, old}, "vpcnid-new"},
		{"the new pod not up yet: still the new one, whose state is then reported", []corev1.Pod{old, newDown}, "vpcnid-new"},
		{"two live pods: the newest", []corev1.Pod{older, newUp}, "vpcnid-new"},
		{"two live pods, one running: the running one", []corev1.Pod{newDown, older}, "vpcnid-older"},
	} {
		if got := pickAgent(tc.pods).Name; got != tc.want {
			t.Errorf("%s: picked %s, want %s", tc.what, got, tc.want)
		}
	}
}

func TestAgentRunning(t *testing.T) {
	t0 := time.Now()
	up := agentPod("vpcnid-a", "n1", t0, true, false)
	if err := agentRunning(&up); err != nil {
		t.Errorf("a running agent: %v", err)
	}
	notReady := up
	notReady.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: AgentContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	if err := agentRunning(&notReady); err != nil {
		t.Errorf("a running agent that is not ready is one to exec into: %v", err)
	}
	crash := agentPod("vpcnid-b", "n1", t0, false, false)
	err := agentRunning(&crash)
	if !errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), "container vpcnid waiting: CrashLoopBackOff: back-off 5m0s") ||
		!strings.Contains(err.Error(), "on node n1 is Pending") {
		t.Errorf("a crash-looping agent: %v", err)
	}
	other := up
	other.Spec.Containers = []corev1.Container{{Name: "nginx"}}
	if err := agentRunning(&other); !errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), `no container "vpcnid"`) {
		t.Errorf("a pod without the agent container: %v", err)
	}
}

// The node figures the plugin reads are the ones the agent writes.
func TestNodeNamesAreTheAgents(t *testing.T) {
	for _, p := range [][2]string{
		{string(IPResource), string(k8s.IPResource)},
		{AnnotationPoolFree, nodeside.AnnotationPoolFree},
		{AnnotationPoolAllocated, nodeside.AnnotationPoolAllocated},
		{AnnotationPoolCooling, nodeside.AnnotationPoolCooling},
		{AnnotationPoolCapacity, nodeside.AnnotationPoolCapacity},
		{TaintNotReady, nodeside.TaintNotReady},
	} {
		if p[0] != p[1] {
			t.Errorf("kubectl-vpcni reads %q, the agent writes %q", p[0], p[1])
		}
	}
}

func TestSummarize(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{
		AnnotationPoolFree: "4", AnnotationPoolAllocated: "6", AnnotationPoolCooling: "1", AnnotationPoolCapacity: "64"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: TaintNotReady, Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Capacity:    corev1.ResourceList{IPResource: resource.MustParse("64")},
			Allocatable: corev1.ResourceList{IPResource: resource.MustParse("62")},
		}}
	agent := agentPod("vpcnid-x", "n1", time.Now(), true, false)
	agent.Status.ContainerStatuses[0].RestartCount = 3
	got := summarize(n, []corev1.Pod{agent})
	want := NodeSummary{Name: "n1", Ready: "True", IPCapacity: "64", IPAllocatable: "62", PoolFree: "4", PoolAllocated: "6",
		PoolCooling: "1", PoolCapacity: "64", NotReadyTaint: true, Agent: "vpcnid-x", AgentStatus: "Ready", AgentRestarts: 3}
	if got != want {
		t.Errorf("summary\n got %+v\nwant %+v", got, want)
	}
	bare := summarize(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}, nil)
	if bare != (NodeSummary{Name: "n2", Ready: "Unknown", AgentStatus: "none"}) {
		t.Errorf("a node without vpcni: %+v", bare)
	}
}

// Every command the plugin runs in the agent is one vpcnictl has: its -h
// succeeds (an unknown command exits 2).
func TestRemoteCommandsAreVpcnictls(t *testing.T) {
	for _, cmd := range remoteCommands {
		var out, errOut bytes.Buffer
		if code := ctl.Main([]string{cmd, "-h"}, &out, &errOut); code != 0 {
			t.Errorf("vpcnictl %s -h: exit %d\n%s%s", cmd, code, out.String(), errOut.String())
		}
	}
	if code := ctl.Main([]string{"no-such-command"}, new(bytes.Buffer), new(bytes.Buffer)); code != 2 {
		t.Errorf("vpcnictl no-such-command: exit %d, want 2: the check above cannot fail", code)
	}
}
