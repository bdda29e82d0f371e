package peer

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/fastblk/csi-fastblk/pkg/kubeapi"
)

// reviewServer is an API server over HTTPS on 127.0.0.1 that answers
// TokenReviews (refusing every token, after a little work, as for a
// token no one issued) and GETs of the claim shop/data, as the plugin's
// client-go client sees one; it counts the reviews.
func reviewServer(b *testing.B) (*rest.Config, *atomic.Int64) {
	b.Helper()
	var reviews atomic.Int64
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, r *http.Request) {
		var tr authnv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		reviews.Add(1)
		time.Sleep(2 * time.Millisecond) // the API server checks the signature and the pod
		tr.Status = authnv1.TokenReviewStatus{Error: "invalid bearer token"}
		reply(w, tr)
	})
	mux.HandleFunc("GET /api/v1/namespaces/shop/persistentvolumeclaims/data", func(w http.ResponseWriter, r *http.Request) {
		reply(w, &corev1.PersistentVolumeClaim{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "data", UID: "u1"}})
	})
	srv := httptest.NewTLSServer(mux)
	b.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}, &reviews
}

// BenchmarkReviewFlood is finding 6 of issue 53 measured: the latency of
// the plugin's other API calls (a GET of a claim, as the authorization of
// a peer's call makes) through the plugin's client (client-go, 20 a
// second, 40 at once) while 64 flooders send a peer's server tokens no one
// issued, well-shaped (they pass every check short of the signature), from
// one address, each a new token every 5 ms:
//   - alone: no flood;
//   - flood/shared: the reviews through the plugin's client and no limit
//     per address, as on main before this change;
//   - flood/bounded: the reviews through a client of their own
//     (ReviewQPS) and at most ReviewBurst at once and ReviewsPerPeer a
//     second from one address.
//
// Each op is one GET; the figures are its median, 90th percentile and
// slowest, and the reviews the API server got a second from the flood's
// start to the last GET. Run with a fixed
// count: go test -run '^$' -bench ReviewFlood -benchtime 40x ./pkg/peer
func BenchmarkReviewFlood(b *testing.B) {
	for _, tc := range []struct {
		name  string
		flood bool
		auth  func(api, reviews dynamic.Interface) *Authenticator
	}{
		{"alone", false, nil},
		{"flood/shared", true, func(api, _ dynamic.Interface) *Authenticator {
			return &Authenticator{API: api, ReviewsPerPeer: rate.Inf}
		}},
		{"flood/bounded", true, func(api, reviews dynamic.Interface) *Authenticator {
			return &Authenticator{API: api, Reviews: reviews}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			cfg, reviewed := reviewServer(b)
			api, err := kubeapi.New(cfg, "bench")
			if err != nil {
				b.Fatal(err)
			}
			reviews, err := kubeapi.NewWithLimit(cfg, "bench-reviews", ReviewQPS, ReviewBurst)
			if err != nil {
				b.Fatal(err)
			}
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			start := time.Now()
			if tc.flood {
				auth := tc.auth(api, reviews)
				auth.Namespace, auth.ServiceAccount, auth.Audience = "csi-fastblk", "csi-fastblk-node", testAudience
				var next atomic.Int64
				for range 64 {
					wg.Go(func() {
						for ctx.Err() == nil {
							vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
							_, _ = auth.Verify(vctx, forgedToken(int(next.Add(1))), "n1", net.IPv4(10, 0, 0, 1))
							cancel()
							time.Sleep(5 * time.Millisecond)
						}
					})
				}
				time.Sleep(2 * time.Second) // the flood under way: the client's burst spent
			}
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if _, err := kubeapi.Get[corev1.PersistentVolumeClaim](context.Background(), api, kubeapi.PersistentVolumeClaims, "shop", "data"); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(t0))
			}
			b.StopTimer()
			perSecond := float64(reviewed.Load()) / time.Since(start).Seconds()
			stop()
			wg.Wait()
			slices.Sort(took)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(took[len(took)/2]), "ms-median")
			b.ReportMetric(ms(took[len(took)*9/10]), "ms-p90")
			b.ReportMetric(ms(took[len(took)-1]), "ms-max")
			b.ReportMetric(perSecond, "reviews/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}
