// Command go_client calls grpc.health.v1.Health/Check on a Unix socket the ways real Go device
// plugins and tools dial the kubelet, one line of output per way:
//
//	<variant> OK <status>      or      <variant> ERR <grpc code> <message>
//
// Variants (the :authority each sends, grpc-go v1.79):
//   - dial-bare-path: grpc.Dial(path) with a custom dialer, as NVIDIA's device plugin does
//     (authority: the socket path);
//   - passthrough-relative: grpc.NewClient("passthrough:///"+path) (authority: the path without
//     its leading slash);
//   - unix-scheme: grpc.NewClient("unix://"+path) (authority: "localhost").
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go_client SOCKET")
		os.Exit(2)
	}
	sock := os.Args[1]
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	creds := grpc.WithTransportCredentials(insecure.NewCredentials())
	type variant struct {
		name string
		conn func() (*grpc.ClientConn, error)
	}
	variants := []variant{
		{"dial-bare-path", func() (*grpc.ClientConn, error) {
			//nolint:staticcheck // grpc.Dial is what deployed plugins still use.
			return grpc.Dial(sock, creds, grpc.WithContextDialer(dialer))
		}},
		{"passthrough-relative", func() (*grpc.ClientConn, error) {
			return grpc.NewClient("passthrough:///"+sock, creds, grpc.WithContextDialer(dialer))
		}},
		{"unix-scheme", func() (*grpc.ClientConn, error) {
			return grpc.NewClient("unix://"+sock, creds)
		}},
	}
	for _, v := range variants {
		conn, err := v.conn()
		if err != nil {
			fmt.Printf("%s ERR dial %v\n", v.name, err)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil {
			st := status.Convert(err)
			fmt.Printf("%s ERR %s %s\n", v.name, st.Code(), st.Message())
		} else {
			fmt.Printf("%s OK %s\n", v.name, resp.GetStatus())
		}
		conn.Close()
	}
}
