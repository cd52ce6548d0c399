// gcp-peer: go-control-plane's LinearCache serving one EDS type over ADS, the peer
// that bench/gcp_compare.py measures meshbridge against (side by side, one run).
//
// It listens on -listen (loopback), prints "listening PORT", then reads commands on
// stdin, one per line:
//
//	set NAME BASE64      the ClusterLoadAssignment NAME is now these bytes (the ones
//	                     meshbridge serves, so both servers send identical resources)
//
// and answers each with "ok" once the cache has taken it (its watches are notified
// by then). It exits when stdin closes.
package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve ADS on")
	flag.Parse()

	linear := cache.NewLinearCache(resource.EndpointType)
	srv := server.NewServer(context.Background(), linear, server.CallbackFuncs{})
	// As meshbridge's port: many streams per connection, messages up to 64 MiB.
	grpcServer := grpc.NewServer(grpc.MaxConcurrentStreams(1<<20),
		grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20))
	discovery.RegisterAggregatedDiscoveryServiceServer(grpcServer, srv)

	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gcp-peer: cannot listen:", err)
		os.Exit(1)
	}
	go func() { _ = grpcServer.Serve(lis) }()
	fmt.Printf("listening %d\n", lis.Addr().(*net.TCPAddr).Port)

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<28)
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) != 3 || fields[0] != "set" {
			fmt.Fprintln(os.Stderr, "gcp-peer: unknown command:", in.Text())
			os.Exit(2)
		}
		raw, err := base64.StdEncoding.DecodeString(fields[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "gcp-peer: bad base64:", err)
			os.Exit(2)
		}
		cla := &endpoint.ClusterLoadAssignment{}
		if err := proto.Unmarshal(raw, cla); err != nil {
			fmt.Fprintln(os.Stderr, "gcp-peer: not a ClusterLoadAssignment:", err)
			os.Exit(2)
		}
		if err := linear.UpdateResource(fields[1], cla); err != nil {
			fmt.Fprintln(os.Stderr, "gcp-peer: update:", err)
			os.Exit(1)
		}
		fmt.Println("ok")
	}
	grpcServer.Stop()
}
