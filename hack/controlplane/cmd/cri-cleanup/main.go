// cri-cleanup stops and removes every Pod sandbox of a CRI runtime, and with them every
// container: what `crictl rmp --all --force` does, built from the same module tree as the
// kubelet so that tearing the real node down needs nothing else. Stopping a sandbox is what
// runs the CNI DEL (the Pod's IP released, its veth and network namespace removed, any
// portmap rules dropped); killing containerd or the shims would skip all of that.
//
//	cri-cleanup -endpoint unix:///path/to/containerd.sock [-timeout 60s]
//
// Prints how many sandboxes it removed; exits non-zero when one could not be.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	remote "k8s.io/cri-client/pkg"
)

func main() {
	endpoint := flag.String("endpoint", "", "the CRI socket, unix:///...")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	flag.Parse()
	if *endpoint == "" {
		fmt.Fprintln(os.Stderr, "cri-cleanup: -endpoint is required")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rs, err := remote.NewRemoteRuntimeService(ctx, *endpoint, 10*time.Second, noop.NewTracerProvider(), false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-cleanup: connecting to %s: %v\n", *endpoint, err)
		os.Exit(1)
	}
	sandboxes, err := rs.ListPodSandbox(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-cleanup: listing sandboxes: %v\n", err)
		os.Exit(1)
	}
	failed := 0
	for _, s := range sandboxes {
		name := s.GetMetadata().GetNamespace() + "/" + s.GetMetadata().GetName()
		if err := rs.StopPodSandbox(ctx, s.Id); err != nil {
			fmt.Fprintf(os.Stderr, "cri-cleanup: stopping sandbox %s (%s): %v\n", s.Id, name, err)
			failed++
			continue
		}
		if err := rs.RemovePodSandbox(ctx, s.Id); err != nil {
			fmt.Fprintf(os.Stderr, "cri-cleanup: removing sandbox %s (%s): %v\n", s.Id, name, err)
			failed++
		}
	}
	fmt.Printf("cri-cleanup: removed %d of %d pod sandboxes\n", len(sandboxes)-failed, len(sandboxes))
	if failed > 0 {
		os.Exit(1)
	}
}
