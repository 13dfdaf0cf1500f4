// pause is the sandbox process of the test node's pods (the image
// registry.k8s.io/pause:3.10 that scripts/k8s-node.sh builds locally). It
// holds the pod's namespaces: it sleeps until SIGINT or SIGTERM, then exits 0,
// and as PID 1 of a shared PID namespace it reaps orphaned children.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited, without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err == syscall.ECHILD {
			return
		}
	}
}
