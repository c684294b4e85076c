package main

import (
	"context"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// ManagedWorkloadReconciler turns a ManagedWorkload into a Deployment (and a Service when it
// asks for one) and reports their state in its status, in the shape kubebuilder scaffolds.
type ManagedWorkloadReconciler struct {
	client.Client
	Scheme *runtime.Scheme
}

// The permissions this needs (role.yaml is what controller-gen would make of these markers):
// +kubebuilder:rbac:groups=opensource-server.mieweb.org,resources=managedworkloads,verbs=get;list;watch
// +kubebuilder:rbac:groups=opensource-server.mieweb.org,resources=managedworkloads/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete

// The operator's default concurrency, so both work on as many workloads at once.
const maxConcurrentReconciles = 32

func (r *ManagedWorkloadReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&ManagedWorkload{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: maxConcurrentReconciles}).
		Complete(r)
}

func (r *ManagedWorkloadReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	// client.Client reads from the manager's informer cache, so this Get costs the API
	// server nothing; only writes go to it.
	var mw ManagedWorkload
	if err := r.Get(ctx, req.NamespacedName, &mw); err != nil {
		// Gone: garbage collection removes what it owned.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !mw.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}

	deployment := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: mw.Name, Namespace: mw.Namespace}}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, deployment, func() error {
		return r.mutateDeployment(&mw, deployment)
	}); err != nil {
		return ctrl.Result{}, fmt.Errorf("deployment %s/%s: %w", mw.Namespace, mw.Name, err)
	}

	service, err := r.reconcileService(ctx, &mw)
	if err != nil {
		return ctrl.Result{}, err
	}

	// Write the status only when it changed: an unchanged status written again is a write
	// for nothing, and its watch event would bring this workload straight back here.
	status := desiredStatus(&mw, deployment, service)
	if equality.Semantic.DeepEqual(mw.Status, status) {
		return ctrl.Result{}, nil
	}
	mw.Status = status
	// A conflict (the cached copy was stale) is returned as an error: the controller retries
	// it with backoff, by then with the newer copy in the cache.
	return ctrl.Result{}, r.Status().Update(ctx, &mw)
}

func labelsFor(mw *ManagedWorkload) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "managedworkload",
		"app.kubernetes.io/instance":   mw.Name,
		"app.kubernetes.io/managed-by": "mw-peer",
	}
}

// mutateDeployment sets the fields this controller owns on the Deployment as it is (new, or
// as read), and leaves the API server's defaults alone: replacing the whole spec would differ
// from the stored object on every defaulted field, and CreateOrUpdate would then update it on
// every reconcile.
func (r *ManagedWorkloadReconciler) mutateDeployment(mw *ManagedWorkload, d *appsv1.Deployment) error {
	labels := labelsFor(mw)
	replicas := int32(1)
	if mw.Spec.State == "Stopped" {
		replicas = 0
	}
	d.Labels = labels
	d.Spec.Replicas = &replicas
	// The selector cannot change once the Deployment exists.
	if d.CreationTimestamp.IsZero() {
		d.Spec.Selector = &metav1.LabelSelector{MatchLabels: labels}
	}
	d.Spec.Template.Labels = labels
	if len(d.Spec.Template.Spec.Containers) != 1 {
		d.Spec.Template.Spec.Containers = []corev1.Container{{}}
	}
	c := &d.Spec.Template.Spec.Containers[0]
	c.Name = "workload"
	c.Image = mw.Spec.Image
	c.Env = mw.Spec.Env
	c.Ports = nil
	for _, p := range mw.Spec.Ports {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: protocol(p)})
	}
	c.Resources.Requests = nil
	if mw.Spec.Resources != nil {
		c.Resources.Requests = mw.Spec.Resources.Requests
	}
	return controllerutil.SetControllerReference(mw, d, r.Scheme)
}

// reconcileService makes the Service the workload asks for (spec.service, with at least one
// port to serve), or deletes the one it owns when it no longer asks; the Service, or nil.
func (r *ManagedWorkloadReconciler) reconcileService(ctx context.Context, mw *ManagedWorkload) (*corev1.Service, error) {
	service := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: mw.Name, Namespace: mw.Namespace}}
	if mw.Spec.Service == nil || len(mw.Spec.Ports) == 0 {
		if err := r.Get(ctx, client.ObjectKeyFromObject(service), service); err != nil {
			return nil, client.IgnoreNotFound(err)
		}
		if metav1.IsControlledBy(service, mw) {
			if err := r.Delete(ctx, service); client.IgnoreNotFound(err) != nil {
				return nil, fmt.Errorf("service %s/%s: %w", mw.Namespace, mw.Name, err)
			}
		}
		return nil, nil
	}
	if _, err := controllerutil.CreateOrUpdate(ctx, r.Client, service, func() error {
		return r.mutateService(mw, service)
	}); err != nil {
		return nil, fmt.Errorf("service %s/%s: %w", mw.Namespace, mw.Name, err)
	}
	return service, nil
}

func (r *ManagedWorkloadReconciler) mutateService(mw *ManagedWorkload, s *corev1.Service) error {
	labels := labelsFor(mw)
	s.Labels = labels
	s.Spec.Type = mw.Spec.Service.Type
	if s.Spec.Type == "" {
		s.Spec.Type = corev1.ServiceTypeClusterIP
	}
	s.Spec.Selector = labels
	// Node ports the API server allocated are kept, or every update would ask for new ones.
	allocated := map[int32]int32{}
	for _, p := range s.Spec.Ports {
		allocated[p.Port] = p.NodePort
	}
	s.Spec.Ports = nil
	for _, p := range mw.Spec.Ports {
		name := p.Name
		// A Service with several ports needs each one named.
		if name == "" && len(mw.Spec.Ports) > 1 {
			name = fmt.Sprintf("%s-%d", strings.ToLower(string(protocol(p))), p.ContainerPort)
		}
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{
			Name:       name,
			Protocol:   protocol(p),
			Port:       p.ContainerPort,
			TargetPort: intstr.FromInt32(p.ContainerPort),
			NodePort:   allocated[p.ContainerPort],
		})
	}
	return controllerutil.SetControllerReference(mw, s, r.Scheme)
}

func protocol(p Port) corev1.Protocol {
	if p.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return p.Protocol
}

// desiredStatus is the workload's status given its Deployment (as the API server returned it
// from the create or update, or as cached) and its Service.
func desiredStatus(mw *ManagedWorkload, d *appsv1.Deployment, s *corev1.Service) ManagedWorkloadStatus {
	var status ManagedWorkloadStatus
	mw.Status.DeepCopyInto(&status)
	status.ObservedGeneration = mw.Generation
	status.Address = ""
	if s != nil {
		status.Address = s.Spec.ClusterIP
	}

	rolledOut := d.Status.ObservedGeneration >= d.Generation
	ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, ObservedGeneration: mw.Generation}
	switch {
	case mw.Spec.State == "Stopped" && rolledOut && d.Status.Replicas == 0:
		status.Phase, ready.Status, ready.Reason, ready.Message = "Stopped", metav1.ConditionTrue, "Stopped", "stopped, no Pod runs"
	case mw.Spec.State == "Stopped":
		status.Phase, ready.Reason, ready.Message = "Stopping", "Stopping", "waiting for the Pod to stop"
	case rolledOut && d.Status.Replicas == 1 && d.Status.UpdatedReplicas == 1 && d.Status.AvailableReplicas == 1:
		status.Phase, ready.Status, ready.Reason, ready.Message = "Running", metav1.ConditionTrue, "Available", "the Deployment is available"
	case mw.Status.Phase == "Running" || mw.Status.Phase == "Updating":
		status.Phase, ready.Reason, ready.Message = "Updating", "Progressing", "waiting for the Deployment's rollout"
	default:
		status.Phase, ready.Reason, ready.Message = "Creating", "Progressing", "waiting for the Deployment to be available"
	}
	// Keeps lastTransitionTime unless the condition's status changed.
	meta.SetStatusCondition(&status.Conditions, ready)
	return status
}
