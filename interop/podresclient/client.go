// Package podresclient is a PodResources API client built only from upstream Go modules
// (k8s.io/kubelet/pkg/apis/podresources/{v1,v1alpha1}, google.golang.org/grpc). It dials the
// socket the way the kubelet's own podresources client and monitoring agents do: a bare socket
// path target with a unix dialer (spec devicemanager.md §5).
package podresclient

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
)

// DefaultMaxMessageSize matches the kubelet podresources client default (16 MiB).
const DefaultMaxMessageSize = 1024 * 1024 * 16

// Client holds one connection and both API versions' stubs.
type Client struct {
	conn     *grpc.ClientConn
	V1       podresourcesv1.PodResourcesListerClient
	V1alpha1 podresourcesv1alpha1.PodResourcesListerClient
}

// Dial connects to the PodResources socket at socketPath, blocking up to timeout.
func Dial(socketPath string, timeout time.Duration) (*Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dialer := func(ctx context.Context, addr string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", addr)
	}
	//nolint:staticcheck // DialContext/WithBlock match what existing agents do.
	conn, err := grpc.DialContext(ctx, socketPath,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		grpc.WithBlock(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(DefaultMaxMessageSize)))
	if err != nil {
		return nil, fmt.Errorf("dial pod resources socket %s: %w", socketPath, err)
	}
	return &Client{
		conn:     conn,
		V1:       podresourcesv1.NewPodResourcesListerClient(conn),
		V1alpha1: podresourcesv1alpha1.NewPodResourcesListerClient(conn),
	}, nil
}

// Close closes the connection.
func (c *Client) Close() error {
	return c.conn.Close()
}

// List calls v1 List.
func (c *Client) List(ctx context.Context) (*podresourcesv1.ListPodResourcesResponse, error) {
	return c.V1.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
}

// ListV1alpha1 calls v1alpha1 List.
func (c *Client) ListV1alpha1(ctx context.Context) (*podresourcesv1alpha1.ListPodResourcesResponse, error) {
	return c.V1alpha1.List(ctx, &podresourcesv1alpha1.ListPodResourcesRequest{})
}

// GetAllocatableResources calls v1 GetAllocatableResources.
func (c *Client) GetAllocatableResources(ctx context.Context) (*podresourcesv1.AllocatableResourcesResponse, error) {
	return c.V1.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
}

// Get calls v1 Get for one pod.
func (c *Client) Get(ctx context.Context, namespace, name string) (*podresourcesv1.GetPodResourcesResponse, error) {
	return c.V1.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: name, PodNamespace: namespace})
}

// DeviceNUMA flattens ContainerDevices entries of one resource into device ID -> NUMA node IDs
// (nil for a device reported without topology).
func DeviceNUMA(devices []*podresourcesv1.ContainerDevices, resource string) map[string][]int64 {
	out := map[string][]int64{}
	for _, cd := range devices {
		if cd.GetResourceName() != resource {
			continue
		}
		for _, id := range cd.GetDeviceIds() {
			nodes := out[id]
			for _, n := range cd.GetTopology().GetNodes() {
				nodes = append(nodes, n.GetID())
			}
			out[id] = nodes
		}
	}
	return out
}
