// Package kubectlplugin is kubectl-vpcni, vpcnictl from an operator's
// workstation: `kubectl vpcni --node NODE status` finds the vpcnid pod of
// the DaemonSet on that node through the API server and runs vpcnictl
// inside its agent container (the pods/exec subresource), so the operator
// needs a kubeconfig, not a shell on the node. `kubectl vpcni nodes` sums
// up every node from the API alone. It runs in kubectl-vpcni only.
package kubectlplugin

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Where vpcni installs its agent: deploy/ and the Helm chart both.
const (
	DefaultNamespace = "vpcni-system"
	// DefaultSelector is the vpcnid DaemonSet's pod selector.
	DefaultSelector = "app.kubernetes.io/name=vpcnid"
	// AgentContainer is the DaemonSet's long-running container, the one
	// that mounts the agent's socket, config and the node's CNI dirs.
	AgentContainer = "vpcnid"
	// vpcnictl is where the image puts it.
	vpcnictl = "/usr/local/bin/vpcnictl"
)

// remoteCommands are vpcnictl's subcommands that read the node the agent
// runs on; they are what kubectl vpcni runs in the agent container. The
// others act on the machine they run on (lab, demo, bench, install-cni),
// or read the cloud with vpcni-controller's file (audit): not an agent's.
var remoteCommands = []string{"status", "trace", "doctor"}

// options are kubectl-vpcni's own flags, and what follows them.
type options struct {
	kubeconfig string
	context    string
	namespace  string
	selector   string
	node       string
	// pod is NAMESPACE/NAME: the agent on that pod's node.
	pod string
	// command is vpcnictl's subcommand and its arguments, or "nodes",
	// "version", "help".
	command []string
}

// usageError is a command line kubectl-vpcni cannot run: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// errHelp: -h asked for the usage, which is not a failure.
var errHelp = errors.New("help requested")

// register puts kubectl-vpcni's own flags on fs (docs/configuration.md
// lists them; a test holds the two equal).
func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "the kubeconfig context to use (default: its current-context)")
	fs.StringVar(&o.namespace, "n", DefaultNamespace, "the namespace vpcni is installed in")
	fs.StringVar(&o.namespace, "namespace", DefaultNamespace, "the namespace vpcni is installed in")
	fs.StringVar(&o.selector, "selector", DefaultSelector, "the label selector of the vpcnid DaemonSet's pods")
	fs.StringVar(&o.node, "node", "", "run the command in the agent on this node")
	fs.StringVar(&o.pod, "pod", "", "NAMESPACE/POD: run the command in the agent on this pod's node")
}

// parseArgs reads kubectl-vpcni's flags up to the first argument that is
// not one (the command); everything from there on is the command's. So
// `--node n1 status -o json` passes `-o json` to vpcnictl status. kubectl
// hands a plugin its arguments as typed: the user's flags for the cluster
// (--kubeconfig, --context, -n) come here too.
func parseArgs(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("kubectl-vpcni", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(stderr) }
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, errHelp
		}
		return o, usageError{err.Error()}
	}
	o.command = fs.Args()
	if len(o.command) == 0 {
		return o, usageError{"no command: status, trace, doctor or nodes"}
	}
	if o.node != "" && o.pod != "" {
		return o, usageError{"--node and --pod both given: one names the node"}
	}
	if o.pod != "" {
		if _, _, err := splitPod(o.pod); err != nil {
			return o, usageError{"--pod: " + err.Error()}
		}
	}
	switch cmd := o.command[0]; {
	case cmd == "help" || cmd == "version":
	case cmd == "nodes":
		if o.node != "" || o.pod != "" {
			return o, usageError{"nodes lists every node: it takes no --node or --pod"}
		}
	case slices.Contains(remoteCommands, cmd):
		if cmd == "trace" {
			o.command = traceArgs(o.command, o.pod)
		}
		if o.node == "" && o.pod == "" && cmd == "trace" {
			// trace NS/POD names its node already.
			o.pod = tracedPod(o.command)
		}
		if o.node == "" && o.pod == "" {
			return o, usageError{fmt.Sprintf("%s: which node? --node NODE or --pod NAMESPACE/POD (kubectl vpcni nodes lists the nodes)", cmd)}
		}
	default:
		return o, usageError{fmt.Sprintf("unknown command %q: kubectl vpcni runs %s in a node's agent, and nodes (vpcnictl's other commands run on the machine itself)",
			cmd, strings.Join(remoteCommands, ", "))}
	}
	return o, nil
}

// tracedPod is the NAMESPACE/POD argument of a trace command line, or "",
// read as vpcnictl trace reads it: the pod before the flags or after
// them. Each of trace's flags takes a value (-o json, --socket PATH), the
// next argument unless written -o=json.
func tracedPod(command []string) string {
	args := command[1:]
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) {
				return podArg(args[i+1])
			}
			return ""
		case strings.HasPrefix(a, "-"):
			if !strings.Contains(a, "=") {
				i++ // its value
			}
		default:
			return podArg(a)
		}
	}
	return ""
}

// podArg is a if it reads NAMESPACE/POD, else "".
func podArg(a string) string {
	if _, _, err := splitPod(a); err != nil {
		return ""
	}
	return a
}

// traceArgs adds --pod's NAMESPACE/POD to a trace that names no pod:
// `kubectl vpcni --pod default/web-1 trace` traces that pod.
func traceArgs(command []string, pod string) []string {
	if pod == "" || tracedPod(command) != "" {
		return command
	}
	return append([]string{command[0], pod}, command[1:]...)
}

// splitPod reads NAMESPACE/NAME.
func splitPod(s string) (ns, name string, err error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q is not NAMESPACE/POD", s)
	}
	return ns, name, nil
}

// Main runs kubectl-vpcni with args (argv[1:]) and returns its exit code:
// the remote vpcnictl's own, or 1 when kubectl-vpcni could not run it, 2
// for a command line it does not understand.
func Main(version string, args []string, stdout, stderr io.Writer) int {
	o, err := parseArgs(args, stderr)
	switch {
	case errors.Is(err, errHelp):
		return 0
	case err != nil:
		fmt.Fprintln(stderr, "kubectl-vpcni:", err)
		fmt.Fprintln(stderr, "Run 'kubectl vpcni help' for usage.")
		return 2
	}
	switch o.command[0] {
	case "help":
		usage(stdout)
		return 0
	case "version":
		fmt.Fprintln(stdout, "kubectl-vpcni", version)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, o, stdout, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "kubectl-vpcni:", err)
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	}
	return code
}

// run carries out a parsed command line.
func run(ctx context.Context, o options, stdout, stderr io.Writer) (int, error) {
	cfg, err := restConfig(o.kubeconfig, o.context)
	if err != nil {
		return 1, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 1, err
	}
	f := finder{cs: cs, namespace: o.namespace, selector: o.selector}
	if o.command[0] == "nodes" {
		return nodes(ctx, f, o.command[1:], stdout)
	}
	node := o.node
	if o.pod != "" {
		if node, err = f.nodeOfPod(ctx, o.pod); err != nil {
			return 1, err
		}
	}
	pod, err := f.agentOn(ctx, node)
	if err != nil {
		return 1, err
	}
	return execVpcnictl(ctx, cfg, cs, pod, o.command, stdout, stderr)
}

// restConfig loads the user's kubeconfig as kubectl does: --kubeconfig,
// else $KUBECONFIG, else ~/.kube/config; --context, else its current one.
func restConfig(kubeconfig, context string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: context}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, errors.New("no kubeconfig: set KUBECONFIG or pass --kubeconfig FILE")
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// apiTimeout bounds each API request of the lookups (not the exec, which
// lasts as long as the command: doctor takes up to 2 minutes).
const apiTimeout = 30 * time.Second

func usage(w io.Writer) {
	fmt.Fprintf(w, `kubectl vpcni — vpcnictl on a node's agent, from your workstation

Usage:
  kubectl vpcni [flags] --node NODE status [-o table|json]
      the agent's health, pool and allocations on NODE; exits 1 while the agent is not ready
  kubectl vpcni [flags] trace NAMESPACE/POD [-o table|json]
      every piece of the pod's path on its node (found from the pod); exits 1 if one is not ok
  kubectl vpcni [flags] --node NODE doctor [-o table|json]
      the node's prerequisites and health, one line per check with what to do
  kubectl vpcni [flags] nodes [-o table|json]
      every node: its vpcni.io/ip capacity, pool figures and agent pod (from the API; no exec)
  kubectl vpcni version

Flags (before the command; what follows it is the command's):
  --node NODE           the node whose agent runs the command
  --pod NAMESPACE/POD   the node of this pod instead
  --kubeconfig FILE     default: $KUBECONFIG, else ~/.kube/config
  --context NAME        a context of the kubeconfig (default: its current one)
  -n, --namespace NS    where vpcni is installed (default: %s)
  --selector SEL        the vpcnid DaemonSet's pod selector (default: %s)

The command runs as vpcnictl in the pod's %s container through pods/exec:
RBAC must let you list pods in the namespace and create pods/exec there.
`, DefaultNamespace, DefaultSelector, AgentContainer)
}
