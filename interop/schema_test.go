// Schema equality between devicelet's .proto files (crates/devicelet-proto/proto) and the
// descriptors compiled into the upstream k8s.io/kubelet Go packages: every package, service,
// method (with streaming flags), message, field (name, number, type, label, presence) and enum
// value must match exactly, in both directions. The Rust crate is generated from these files,
// so this pins its wire format to upstream.
package interop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	// Registers the upstream descriptors in protoregistry.GlobalFiles.
	_ "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	_ "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	_ "k8s.io/kubelet/pkg/apis/dra/v1"
	_ "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	_ "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	_ "k8s.io/kubelet/pkg/apis/podresources/v1"
	_ "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
)

// protoDir is crates/devicelet-proto/proto relative to this module.
const protoDir = "../crates/devicelet-proto/proto"

var ourProtoFiles = []string{
	"k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto",
	"k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
	"k8s.io/kubelet/pkg/apis/podresources/v1/api.proto",
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1/api.proto",
	"k8s.io/kubelet/pkg/apis/dra/v1/api.proto",
	"k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto",
	"k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto",
}

// describeFile renders every wire-relevant part of a file's declarations, one line each.
func describeFile(fd protoreflect.FileDescriptor) []string {
	var out []string
	out = append(out, "package "+string(fd.Package()))
	services := fd.Services()
	for i := 0; i < services.Len(); i++ {
		s := services.Get(i)
		out = append(out, "service "+string(s.FullName()))
		methods := s.Methods()
		for j := 0; j < methods.Len(); j++ {
			m := methods.Get(j)
			out = append(out, fmt.Sprintf("rpc /%s/%s(%s stream=%v) returns (%s stream=%v)",
				s.FullName(), m.Name(), m.Input().FullName(), m.IsStreamingClient(),
				m.Output().FullName(), m.IsStreamingServer()))
		}
	}
	var describeMessages func(protoreflect.MessageDescriptors)
	describeMessages = func(msgs protoreflect.MessageDescriptors) {
		for i := 0; i < msgs.Len(); i++ {
			m := msgs.Get(i)
			if m.IsMapEntry() {
				// Described through the map field's key/value kinds below.
				continue
			}
			out = append(out, "message "+string(m.FullName()))
			fields := m.Fields()
			for j := 0; j < fields.Len(); j++ {
				out = append(out, describeField(m, fields.Get(j)))
			}
			reserved := m.ReservedRanges()
			for j := 0; j < reserved.Len(); j++ {
				r := reserved.Get(j)
				out = append(out, fmt.Sprintf("reserved %s %d-%d", m.FullName(), r[0], r[1]-1))
			}
			describeMessages(m.Messages())
		}
	}
	describeMessages(fd.Messages())
	enums := fd.Enums()
	for i := 0; i < enums.Len(); i++ {
		e := enums.Get(i)
		out = append(out, "enum "+string(e.FullName()))
		values := e.Values()
		for j := 0; j < values.Len(); j++ {
			out = append(out, fmt.Sprintf("value %s = %d", values.Get(j).FullName(), values.Get(j).Number()))
		}
	}
	sort.Strings(out)
	return out
}

func describeField(m protoreflect.MessageDescriptor, f protoreflect.FieldDescriptor) string {
	kind := typeName(f)
	if f.IsMap() {
		kind = fmt.Sprintf("map<%s,%s>", typeName(f.MapKey()), typeName(f.MapValue()))
	}
	return fmt.Sprintf("field %s.%s = %d %s %s presence=%v json=%s",
		m.FullName(), f.Name(), f.Number(), f.Cardinality(), kind, f.HasPresence(), f.JSONName())
}

func typeName(f protoreflect.FieldDescriptor) string {
	switch f.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return string(f.Message().FullName())
	case protoreflect.EnumKind:
		return string(f.Enum().FullName())
	default:
		return f.Kind().String()
	}
}

// upstreamFileFor finds the upstream file that declares the first message of ours.
func upstreamFileFor(t *testing.T, ours protoreflect.FileDescriptor) protoreflect.FileDescriptor {
	t.Helper()
	var anchor protoreflect.FullName
	switch {
	case ours.Services().Len() > 0:
		anchor = ours.Services().Get(0).FullName()
	case ours.Messages().Len() > 0:
		anchor = ours.Messages().Get(0).FullName()
	default:
		t.Fatalf("%s declares nothing", ours.Path())
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(anchor)
	if err != nil {
		t.Fatalf("upstream has no %s: %v", anchor, err)
	}
	return d.ParentFile()
}

func TestProtoFilesMatchUpstreamKubeletDescriptors(t *testing.T) {
	if _, err := os.Stat(protoDir); err != nil {
		t.Fatalf("proto directory %s: %v", protoDir, err)
	}
	compiler := protocompile.Compiler{
		Resolver: &protocompile.SourceResolver{ImportPaths: []string{protoDir}},
	}
	for _, path := range ourProtoFiles {
		t.Run(filepath.Dir(path), func(t *testing.T) {
			files, err := compiler.Compile(context.Background(), path)
			if err != nil {
				t.Fatalf("compiling %s: %v", path, err)
			}
			ours := files[0]
			if ours.Syntax() != protoreflect.Proto3 {
				t.Errorf("%s: syntax %v, want proto3", path, ours.Syntax())
			}
			if ours.Imports().Len() != 0 {
				t.Errorf("%s imports other files; the kubelet APIs are self-contained", path)
			}
			upstream := upstreamFileFor(t, ours)
			got, want := describeFile(ours), describeFile(upstream)
			missing, extra := diffLines(want, got)
			if len(missing) > 0 || len(extra) > 0 {
				t.Errorf("%s differs from upstream %s\nmissing (upstream only):\n  %s\nextra (ours only):\n  %s",
					path, upstream.Path(), strings.Join(missing, "\n  "), strings.Join(extra, "\n  "))
			}
			if len(want) < 3 {
				t.Fatalf("upstream description of %s is suspiciously small: %v", upstream.Path(), want)
			}
		})
	}
}

// diffLines returns lines only in want and lines only in got (both sorted).
func diffLines(want, got []string) (missing, extra []string) {
	inGot := map[string]bool{}
	for _, g := range got {
		inGot[g] = true
	}
	inWant := map[string]bool{}
	for _, w := range want {
		inWant[w] = true
		if !inGot[w] {
			missing = append(missing, w)
		}
	}
	for _, g := range got {
		if !inWant[g] {
			extra = append(extra, g)
		}
	}
	return missing, extra
}
