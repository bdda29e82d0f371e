// Command pause is the pod sandbox process of the Kubernetes harness's
// locally built sandbox image (hack/k8s): it holds the pod's namespaces,
// reaps the orphans it inherits as the pod's init process, and exits on
// SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
