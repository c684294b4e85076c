package main

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

// The ManagedWorkload API as a kubebuilder project would declare it (api/v1alpha1), cut down
// to the fields this controller reads and writes. Fields it does not declare are dropped when
// it decodes an object; that is harmless because it only ever writes the status subresource,
// where the API server takes the status alone from the body.

var (
	GroupVersion  = schema.GroupVersion{Group: "opensource-server.mieweb.org", Version: "v1alpha1"}
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}
	AddToScheme   = SchemeBuilder.AddToScheme
)

func init() {
	SchemeBuilder.Register(&ManagedWorkload{}, &ManagedWorkloadList{})
}

type ManagedWorkload struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ManagedWorkloadSpec   `json:"spec,omitempty"`
	Status ManagedWorkloadStatus `json:"status,omitempty"`
}

type ManagedWorkloadList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ManagedWorkload `json:"items"`
}

type ManagedWorkloadSpec struct {
	Image string `json:"image"`
	// "Running" (the default when empty) or "Stopped".
	State string `json:"state,omitempty"`
	// The CRD's env entries are a subset of a container's (value, or valueFrom a Secret or
	// ConfigMap key), so Kubernetes' own type reads them.
	Env       []corev1.EnvVar `json:"env,omitempty"`
	Ports     []Port          `json:"ports,omitempty"`
	Service   *ServiceSpec    `json:"service,omitempty"`
	Resources *Resources      `json:"resources,omitempty"`
}

type Port struct {
	ContainerPort int32           `json:"containerPort"`
	Name          string          `json:"name,omitempty"`
	Protocol      corev1.Protocol `json:"protocol,omitempty"`
}

type ServiceSpec struct {
	Type corev1.ServiceType `json:"type,omitempty"`
}

type Resources struct {
	Requests corev1.ResourceList `json:"requests,omitempty"`
}

type ManagedWorkloadStatus struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	Phase              string             `json:"phase,omitempty"`
	Address            string             `json:"address,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}

// The deep copies controller-gen would generate (zz_generated.deepcopy.go), written out by
// hand: the scheme and the cache need them, and a hand-written copy keeps this module free of
// a code generator.

func (in *ManagedWorkload) DeepCopyInto(out *ManagedWorkload) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

func (in *ManagedWorkload) DeepCopy() *ManagedWorkload {
	if in == nil {
		return nil
	}
	out := new(ManagedWorkload)
	in.DeepCopyInto(out)
	return out
}

func (in *ManagedWorkload) DeepCopyObject() runtime.Object {
	return in.DeepCopy()
}

func (in *ManagedWorkloadList) DeepCopyInto(out *ManagedWorkloadList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]ManagedWorkload, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

func (in *ManagedWorkloadList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(ManagedWorkloadList)
	in.DeepCopyInto(out)
	return out
}

func (in *ManagedWorkloadSpec) DeepCopyInto(out *ManagedWorkloadSpec) {
	*out = *in
	if in.Env != nil {
		out.Env = make([]corev1.EnvVar, len(in.Env))
		for i := range in.Env {
			in.Env[i].DeepCopyInto(&out.Env[i])
		}
	}
	if in.Ports != nil {
		out.Ports = make([]Port, len(in.Ports))
		copy(out.Ports, in.Ports)
	}
	if in.Service != nil {
		out.Service = new(ServiceSpec)
		*out.Service = *in.Service
	}
	if in.Resources != nil {
		out.Resources = &Resources{Requests: in.Resources.Requests.DeepCopy()}
	}
}

func (in *ManagedWorkloadStatus) DeepCopyInto(out *ManagedWorkloadStatus) {
	*out = *in
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
}
