package kubectlplugin

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What vpcnid publishes on its Node (internal/k8s/nodeside writes them; a
// test holds these equal, without linking the agent into this binary).
const (
	IPResource              corev1.ResourceName = "vpcni.io/ip"
	AnnotationPoolFree                          = "vpcni.io/pool-free"
	AnnotationPoolAllocated                     = "vpcni.io/pool-allocated"
	AnnotationPoolCooling                       = "vpcni.io/pool-cooling"
	AnnotationPoolCapacity                      = "vpcni.io/pool-capacity"
	TaintNotReady                               = "vpcni.io/not-ready"
)

// NodeSummary is one node in kubectl vpcni nodes (its -o json is a list
// of them). A figure the node does not publish is empty.
type NodeSummary struct {
	Name string `json:"name"`
	// Ready is the Node's Ready condition: True, False or Unknown.
	Ready string `json:"ready"`
	// IPCapacity and IPAllocatable are the node's vpcni.io/ip, as the
	// scheduler counts it.
	IPCapacity    string `json:"ipCapacity,omitempty"`
	IPAllocatable string `json:"ipAllocatable,omitempty"`
	// The pool's figures, from the agent's annotations.
	PoolFree      string `json:"poolFree,omitempty"`
	PoolAllocated string `json:"poolAllocated,omitempty"`
	PoolCooling   string `json:"poolCooling,omitempty"`
	PoolCapacity  string `json:"poolCapacity,omitempty"`
	// NotReadyTaint: the agent keeps new pods off until its pool is warm.
	NotReadyTaint bool `json:"notReadyTaint"`
	// Agent is the node's vpcnid pod, empty when it has none.
	Agent         string `json:"agent,omitempty"`
	AgentStatus   string `json:"agentStatus"`
	AgentRestarts int32  `json:"agentRestarts"`
}

// nodes prints every node's summary, from the API server alone.
func nodes(ctx context.Context, f finder, args []string, out io.Writer) (int, error) {
	fs := flag.NewFlagSet("nodes", flag.ContinueOnError)
	fs.SetOutput(out)
	format := fs.String("o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0, nil
		}
		return 2, usageError{"nodes: " + err.Error()}
	}
	if *format != "table" && *format != "json" {
		return 2, usageError{fmt.Sprintf("nodes: unknown output format %q (table or json)", *format)}
	}
	sums, err := f.summaries(ctx)
	if err != nil {
		return 1, err
	}
	if *format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return 0, enc.Encode(sums)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tREADY\tIP ALLOCATABLE/CAPACITY\tPOOL FREE\tALLOCATED\tCOOLING\tPOOL CAPACITY\tNOT-READY TAINT\tAGENT\tAGENT STATUS\tRESTARTS")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	for _, s := range sums {
		ip := "-"
		if s.IPCapacity != "" || s.IPAllocatable != "" {
			ip = dash(s.IPAllocatable) + "/" + dash(s.IPCapacity)
		}
		taint := "no"
		if s.NotReadyTaint {
			taint = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", s.Name, s.Ready, ip,
			dash(s.PoolFree), dash(s.PoolAllocated), dash(s.PoolCooling), dash(s.PoolCapacity), taint,
			dash(s.Agent), s.AgentStatus, s.AgentRestarts)
	}
	return 0, tw.Flush()
}

// summaries reads the nodes and the agent pods and joins them by node.
func (f finder) summaries(ctx context.Context) ([]NodeSummary, error) {
	ctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	nodes, err := f.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the nodes: %w", forbidden(err, "list", "nodes", ""))
	}
	pods, err := f.cs.CoreV1().Pods(f.namespace).List(ctx, metav1.ListOptions{LabelSelector: f.selector})
	if err != nil {
		return nil, fmt.Errorf("list the agent pods: %w", forbidden(err, "list", "pods", f.namespace))
	}
	byNode := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
	}
	sums := make([]NodeSummary, 0, len(nodes.Items))
	for _, n := range nodes.Items {
		sums = append(sums, summarize(&n, byNode[n.Name]))
	}
	slices.SortFunc(sums, func(a, b NodeSummary) int { return strings.Compare(a.Name, b.Name) })
	return sums, nil
}

// summarize is one node's line: its figures and its agent pod's state.
func summarize(n *corev1.Node, agents []corev1.Pod) NodeSummary {
	s := NodeSummary{Name: n.Name, Ready: "Unknown",
		PoolFree: n.Annotations[AnnotationPoolFree], PoolAllocated: n.Annotations[AnnotationPoolAllocated],
		PoolCooling: n.Annotations[AnnotationPoolCooling], PoolCapacity: n.Annotations[AnnotationPoolCapacity]}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			s.Ready = string(c.Status)
		}
	}
	if q, ok := n.Status.Capacity[IPResource]; ok {
		s.IPCapacity = q.String()
	}
	if q, ok := n.Status.Allocatable[IPResource]; ok {
		s.IPAllocatable = q.String()
	}
	s.NotReadyTaint = slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintNotReady })
	if len(agents) == 0 {
		s.AgentStatus = "none"
		return s
	}
	p := pickAgent(agents)
	s.Agent = p.Name
	s.AgentStatus = agentStatus(p)
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == AgentContainer {
			s.AgentRestarts = cs.RestartCount
		}
	}
	return s
}

// agentStatus is the agent pod's state in a word or two: Ready, Running
// (not ready), Terminating, or what it waits for (CrashLoopBackOff…).
func agentStatus(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "Terminating"
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != AgentContainer {
			continue
		}
		switch {
		case cs.State.Running != nil && cs.Ready:
			return "Ready"
		case cs.State.Running != nil:
			return "Running (not ready)"
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
			return cs.State.Waiting.Reason
		case cs.State.Terminated != nil:
			return "Terminated: " + cs.State.Terminated.Reason
		}
	}
	return string(p.Status.Phase)
}
