module devicelet.invalid/interop/checkpoint

go 1.26.0

require (
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af
	k8s.io/kubelet v0.36.3
	k8s.io/kubernetes v1.36.3
)

require (
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/fsnotify/fsnotify v1.9.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.40.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260128011058-8636f8732409 // indirect
	google.golang.org/grpc v1.79.3 // indirect
	k8s.io/apimachinery v0.36.3 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/utils v0.0.0-20260210185600-b8788abfbbc2 // indirect
)

// k8s.io/kubernetes requires its staging modules at v0.0.0 (replaced by ./staging/... in its
// own repository only). Point the ones this module builds at the release that matches v1.36.3.
replace (
	k8s.io/apimachinery => k8s.io/apimachinery v0.36.3
	k8s.io/kubelet => k8s.io/kubelet v0.36.3
)
