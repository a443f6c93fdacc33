// Command podresources-client queries a PodResources socket (devicelet's or a kubelet's) with the
// upstream Go client types and prints the response as JSON.
//
//	podresources-client -socket /var/lib/kubelet/pod-resources/kubelet.sock list
//	podresources-client -socket R/pod-resources/kubelet.sock allocatable
//	podresources-client -socket ... get -namespace default -pod mypod
//	podresources-client -socket ... list-v1alpha1
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"devicelet.invalid/interop/podresclient"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

func main() {
	socket := flag.String("socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "PodResources socket path")
	namespace := flag.String("namespace", "default", "pod namespace (get)")
	pod := flag.String("pod", "", "pod name (get)")
	timeout := flag.Duration("timeout", 10*time.Second, "dial and call timeout")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [flags] list|list-v1alpha1|allocatable|get\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *socket, *namespace, *pod, *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "podresources-client: %v\n", err)
		os.Exit(1)
	}
}

func run(call, socket, namespace, pod string, timeout time.Duration) error {
	client, err := podresclient.Dial(socket, timeout)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	var resp proto.Message
	switch call {
	case "list":
		resp, err = client.List(ctx)
	case "list-v1alpha1":
		resp, err = client.ListV1alpha1(ctx)
	case "allocatable":
		resp, err = client.GetAllocatableResources(ctx)
	case "get":
		if pod == "" {
			return fmt.Errorf("get needs -pod")
		}
		resp, err = client.Get(ctx, namespace, pod)
	default:
		return fmt.Errorf("unknown call %q (want list, list-v1alpha1, allocatable or get)", call)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", call, err)
	}
	out, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(resp)
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}
