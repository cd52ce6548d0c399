module meshbridge.invalid/sotw-client

go 1.24

require (
	github.com/envoyproxy/go-control-plane/envoy v1.32.4
	golang.org/x/net v0.47.0
	golang.org/x/sys v0.38.0
	google.golang.org/protobuf v1.36.8
)
