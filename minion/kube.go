package minion

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"

	"github.com/meshfed/meshfed/mcp"
)

// Event reasons the minion records on objects.
const (
	ReasonInvalidSpec   = "InvalidSpec"
	ReasonRejectedByHub = "RejectedByHub"
	// ReasonDeletionHeldByHub: the object was deleted here, but the hub's mass-deletion
	// breaker holds the deletion (the hub keeps serving the object).
	ReasonDeletionHeldByHub = "DeletionHeldByHub"
)

// KubeSource publishes Kubernetes objects of the configured kinds, read through dynamic
// informers.
type KubeSource struct {
	name    string
	cfg     SourceConfig
	kinds   []Kind
	store   *Store
	log     *slog.Logger
	metrics *Metrics
	rest    *rest.Config

	mu        sync.Mutex                             // guards the following fields
	informers map[string][]cache.SharedIndexInformer // collection -> one per namespace
	reported  map[string]string                      // object key -> last reason recorded as an Event
	synced    bool
	recorder  record.EventRecorder
}

// NewKubeSource returns a source for the k8s:// URL in cfg.
func NewKubeSource(cfg SourceConfig, kinds []Kind, store *Store, log *slog.Logger, m *Metrics) (*KubeSource, error) {
	u, err := parseSourceURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	var rc *rest.Config
	if u.inCluster {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: u.path},
			&clientcmd.ConfigOverrides{CurrentContext: u.kubeCtx}).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.URL, err)
	}
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = 50, 100
	rc.UserAgent = "meshfed-minion"
	return &KubeSource{name: cfg.URL, cfg: cfg, kinds: kinds, store: store, log: log.With("source", cfg.URL), metrics: m, rest: rc,
		informers: map[string][]cache.SharedIndexInformer{}, reported: map[string]string{}}, nil
}

// Name returns the source's URL.
func (s *KubeSource) Name() string { return s.name }

// Synced reports whether every informer has listed once.
func (s *KubeSource) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// Run starts the informers and publishes every change until ctx ends.
func (s *KubeSource) Run(ctx context.Context) error {
	dyn, err := dynamic.NewForConfig(s.rest)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	core, err := typedcorev1.NewForConfig(s.rest)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: core.Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "meshfed-minion"})
	s.mu.Lock()
	s.recorder = recorder
	s.mu.Unlock()

	kinds, err := s.servedKinds()
	if err != nil {
		return err
	}
	resync := DefaultResync
	if s.cfg.Resync != nil {
		resync = s.cfg.Resync.Duration
	}
	namespaces := s.cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	var factories []dynamicinformer.DynamicSharedInformerFactory
	var syncs []cache.InformerSynced
	for _, ns := range namespaces {
		f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, resync, ns, func(o *metav1.ListOptions) {
			o.LabelSelector = s.cfg.LabelSelector
		})
		factories = append(factories, f)
		for _, k := range kinds {
			if k.ClusterScoped && ns != metav1.NamespaceAll {
				continue
			}
			inf := f.ForResource(k.GVR()).Informer()
			if err := inf.SetTransform(trimObject); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			reg, err := inf.AddEventHandler(s.handler(k))
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			s.mu.Lock()
			s.informers[k.Collection] = append(s.informers[k.Collection], inf)
			s.mu.Unlock()
			// The handler's sync, not the informer's: the informer's cache can be complete
			// before our handler has put every initial object in the store, and the minion
			// starts publishing when its sources are synced — a first push without those
			// objects would read as their deletion at the hub.
			syncs = append(syncs, reg.HasSynced)
		}
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	defer func() {
		for _, f := range factories {
			f.Shutdown()
		}
	}()
	s.log.Info("waiting for informers to sync", "kinds", len(kinds), "namespaces", namespaces, "labelSelector", s.cfg.LabelSelector)
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return nil // ctx ended
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	s.log.Info("informers synced")
	<-ctx.Done()
	return nil
}

func (s *KubeSource) handler(k Kind) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { s.upsert(k, obj) },
		UpdateFunc: func(old, obj any) {
			// A resync delivers the object unchanged: nothing to convert or publish.
			if o, ok := old.(*unstructured.Unstructured); ok {
				if n, ok := obj.(*unstructured.Unstructured); ok && o.GetResourceVersion() == n.GetResourceVersion() {
					s.metrics.resync(k.Collection)
					return
				}
			}
			s.upsert(k, obj)
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				return
			}
			name := resourceName(k, u)
			s.store.Apply(s.name, k.Collection, nil, []string{name})
			s.mu.Lock()
			delete(s.reported, k.Collection+"/"+name)
			s.mu.Unlock()
		},
	}
}

// trimObject drops what the minion never reads from an object before the informer caches
// it: managedFields and kubectl's last-applied copy of the object, which together are often
// larger than the object itself.
func trimObject(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.SetManagedFields(nil)
		if a := u.GetAnnotations(); a != nil {
			if _, has := a[lastApplied]; has {
				delete(a, lastApplied)
				u.SetAnnotations(a)
			}
		}
	}
	return obj, nil
}

func resourceName(k Kind, u *unstructured.Unstructured) string {
	if k.ClusterScoped || u.GetNamespace() == "" {
		return u.GetName()
	}
	return u.GetNamespace() + "/" + u.GetName()
}

func (s *KubeSource) upsert(k Kind, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	o := &Object{Namespace: u.GetNamespace(), Name: u.GetName(), Created: u.GetCreationTimestamp().Time,
		Labels: u.GetLabels(), Annotations: u.GetAnnotations(), Content: map[string]any{}}
	if k.ClusterScoped {
		o.Namespace = ""
	}
	for key, v := range u.Object {
		if key != "apiVersion" && key != "kind" && key != "metadata" {
			o.Content[key] = v
		}
	}
	e, err := Convert(k, o)
	s.metrics.conversion(k.Collection, err)
	if err != nil {
		// Not published; the last good version (if any) stays.
		s.warnOnce(u, k.Collection+"/"+o.ResourceName(), ReasonInvalidSpec, err.Error())
		return
	}
	s.mu.Lock()
	delete(s.reported, k.Collection+"/"+o.ResourceName())
	s.mu.Unlock()
	s.store.Apply(s.name, k.Collection, []*mcp.Entry{e}, nil)
}

// warnOnce records a Warning Event on u and logs, unless the same reason was already
// recorded for it (informer resyncs would repeat it).
func (s *KubeSource) warnOnce(u runtime.Object, key, reason, msg string) {
	s.mu.Lock()
	if s.reported[key] == reason+"\x00"+msg {
		s.mu.Unlock()
		return
	}
	s.reported[key] = reason + "\x00" + msg
	rec := s.recorder
	s.mu.Unlock()
	what := "object not published"
	if reason == ReasonDeletionHeldByHub {
		what = "object deleted here, but the hub holds the deletion and still serves it"
	}
	s.log.Warn(what, "object", key, "reason", reason, "message", msg)
	if rec != nil {
		rec.Event(u, corev1.EventTypeWarning, reason, msg)
	}
}

// ReportRejection records a hub rejection as a Warning Event on the object, if this source
// has it.
func (s *KubeSource) ReportRejection(collection, resource, reason string) bool {
	s.mu.Lock()
	infs := s.informers[collection]
	s.mu.Unlock()
	for _, inf := range infs {
		obj, exists, err := inf.GetStore().GetByKey(resource)
		if err != nil || !exists {
			continue
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			s.warnOnce(u, collection+"/"+resource, ReasonRejectedByHub, reason)
			return true
		}
	}
	return false
}

// ReportHeldDeletion records, as a Warning Event on the object's reference, that the hub
// holds its deletion, if this source publishes the collection. The object is gone from
// the API server, so the Event names it by kind, namespace and name
// (kubectl get events -n NAMESPACE shows it).
func (s *KubeSource) ReportHeldDeletion(collection, resource, reason string) bool {
	for _, k := range s.kinds {
		if k.Collection != collection {
			continue
		}
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(k.GVR().GroupVersion().String())
		u.SetKind(k.Kind)
		ns, name, ok := strings.Cut(resource, "/")
		if !ok {
			ns, name = "", resource
		}
		u.SetNamespace(ns)
		u.SetName(name)
		s.warnOnce(u, collection+"/"+resource, ReasonDeletionHeldByHub, reason)
		return true
	}
	return false
}

// servedKinds returns the configured kinds the API server serves. A kind whose resource is
// not served (its CRD is not installed) is skipped with a warning instead of blocking the
// sync forever; installing the CRD later takes a restart (or a config reload).
func (s *KubeSource) servedKinds() ([]Kind, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(s.rest)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.name, err)
	}
	served := map[string]map[string]bool{} // group/version -> resources
	var out []Kind
	for _, k := range s.kinds {
		gv := k.GVR().GroupVersion().String()
		if served[gv] == nil {
			served[gv] = map[string]bool{}
			list, err := dc.ServerResourcesForGroupVersion(gv)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return nil, fmt.Errorf("%s: discover %s: %w", s.name, gv, err)
			default:
				for _, r := range list.APIResources {
					served[gv][r.Name] = true
				}
			}
		}
		if !served[gv][k.Resource] {
			s.log.Warn("kind not served by the API server (CRD not installed?); skipping it", "collection", k.Collection, "resource", k.GVR().String())
			continue
		}
		out = append(out, k)
	}
	return out, nil
}
