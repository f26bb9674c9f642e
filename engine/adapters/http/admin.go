package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Listing bounds of the admin API.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
	// DefaultReloadTimeout bounds a reload: it compiles plugins, so it gets
	// longer than a read, still under the server's WriteTimeout.
	DefaultReloadTimeout = 25 * time.Second
)

// nameRE is config's rule for upstream and routing names; a path segment
// outside it cannot name anything, so it is 404 without asking the
// controller (and never reaches the audit log).
var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// AdminOptions configure NewAdmin.
type AdminOptions struct {
	Admin    Admin
	Reloader Reloader
	// Surface is config.Config.Admin.
	Surface config.Surface
	// Timeout bounds each controller call except reload; 0 means
	// DefaultRequestTimeout.
	Timeout time.Duration
	// ReloadTimeout bounds a reload; 0 means DefaultReloadTimeout.
	ReloadTimeout time.Duration
	Registry      prometheus.Registerer
	Logger        *slog.Logger
}

// AdminHandler serves the admin API.
type AdminHandler struct {
	*surface
	admin         Admin
	reloader      Reloader
	timeout       time.Duration
	reloadTimeout time.Duration
}

var adminRoutes = []route[*AdminHandler]{
	{routeSpec{http.MethodGet, "/v1/admin/status", []int{200, 401, 403, 500, 503}}, (*AdminHandler).status},
	{routeSpec{http.MethodGet, "/v1/admin/upstreams", []int{200, 401, 403, 500, 503}}, (*AdminHandler).upstreams},
	{routeSpec{http.MethodPost, "/v1/admin/upstreams/{name}/enable", []int{200, 401, 403, 404, 500, 503}}, (*AdminHandler).enable},
	{routeSpec{http.MethodPost, "/v1/admin/upstreams/{name}/disable", []int{200, 401, 403, 404, 500, 503}}, (*AdminHandler).disable},
	{routeSpec{http.MethodGet, "/v1/admin/routings", []int{200, 401, 403, 500, 503}}, (*AdminHandler).routings},
	{routeSpec{http.MethodPost, "/v1/admin/routings/{name}/switch", []int{200, 400, 401, 403, 404, 413, 415, 500, 503}}, (*AdminHandler).switchRouting},
	{routeSpec{http.MethodPost, "/v1/admin/reload", []int{200, 401, 403, 422, 500, 503}}, (*AdminHandler).reload},
	{routeSpec{http.MethodGet, "/v1/admin/proxies", []int{200, 400, 401, 403, 500, 503}}, (*AdminHandler).proxies},
	{routeSpec{http.MethodGet, "/v1/admin/audit", []int{200, 400, 401, 403, 500, 503}}, (*AdminHandler).audit},
}

// NewAdmin builds the admin API handler.
func NewAdmin(o AdminOptions) (*AdminHandler, error) {
	if o.Admin == nil || o.Reloader == nil {
		return nil, errors.New("building admin api: Admin and Reloader are required")
	}
	s, err := newSurface(surfaceAdmin, true, o.Registry, o.Logger)
	if err != nil {
		return nil, fmt.Errorf("building admin api: %w", err)
	}
	a := &AdminHandler{surface: s, admin: o.Admin, reloader: o.Reloader, timeout: o.Timeout, reloadTimeout: o.ReloadTimeout}
	if a.timeout <= 0 {
		a.timeout = DefaultRequestTimeout
	}
	if a.reloadTimeout <= 0 {
		a.reloadTimeout = DefaultReloadTimeout
	}
	if err := a.Reconfigure(o.Surface); err != nil {
		return nil, fmt.Errorf("building admin api: %w", err)
	}
	s.mux = newMux(a, adminRoutes)
	return a, nil
}

// Reconfigure swaps auth, access and the body bound atomically; on error
// the previous configuration stays in force.
func (a *AdminHandler) Reconfigure(s config.Surface) error { return a.configure(s) }

// ack is the answer of a successful admin write.
type ack struct {
	OK bool `json:"ok"`
}

func (a *AdminHandler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), a.timeout)
}

func (a *AdminHandler) fail(w http.ResponseWriter, op string, err error) {
	writeProblem(w, problemFor(a.log, op, err))
}

func (a *AdminHandler) status(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := a.ctx(r)
	defer cancel()
	st, err := a.admin.Status(ctx)
	if err != nil {
		a.fail(w, "status", err)
		return
	}
	// The contract has arrays and objects here, never null.
	st.Proxies = nonNilMap(st.Proxies)
	if st.Workers == nil {
		st.Workers = []controller.WorkerStatus{}
	}
	writeJSON(w, http.StatusOK, st)
}

type upstreamsResponse struct {
	Upstreams []controller.UpstreamStatus `json:"upstreams"`
}

func (a *AdminHandler) upstreams(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := a.ctx(r)
	defer cancel()
	us, err := a.admin.Upstreams(ctx)
	if err != nil {
		a.fail(w, "upstreams", err)
		return
	}
	out := upstreamsResponse{Upstreams: make([]controller.UpstreamStatus, 0, len(us))}
	for _, u := range us {
		u.States = nonNilMap(u.States)
		out.Upstreams = append(out.Upstreams, u)
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *AdminHandler) enable(w http.ResponseWriter, r *http.Request) {
	a.setEnabled(w, r, true)
}

func (a *AdminHandler) disable(w http.ResponseWriter, r *http.Request) {
	a.setEnabled(w, r, false)
}

func (a *AdminHandler) setEnabled(w http.ResponseWriter, r *http.Request, enabled bool) {
	name := r.PathValue("name")
	if !nameRE.MatchString(name) {
		a.fail(w, "set upstream enabled", fmt.Errorf("%w %q", controller.ErrUnknownUpstream, name))
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	if err := a.admin.SetUpstreamEnabled(ctx, principalOf(r.Context()).Name, name, enabled); err != nil {
		a.fail(w, "set upstream enabled", err)
		return
	}
	writeJSON(w, http.StatusOK, ack{OK: true})
}

type routingsResponse struct {
	Routings []controller.RoutingStatus `json:"routings"`
}

func (a *AdminHandler) routings(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := a.ctx(r)
	defer cancel()
	rs, err := a.admin.Routings(ctx)
	if err != nil {
		a.fail(w, "routings", err)
		return
	}
	out := routingsResponse{Routings: make([]controller.RoutingStatus, 0, len(rs))}
	for _, rt := range rs {
		if rt.Upstreams == nil {
			rt.Upstreams = []string{}
		}
		out.Routings = append(out.Routings, rt)
	}
	writeJSON(w, http.StatusOK, out)
}

type switchBody struct {
	Index *int `json:"index"`
}

func (a *AdminHandler) switchRouting(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if p := requireJSON(r); p != nil {
		writeProblem(w, p)
		return
	}
	var b switchBody
	err := decodeStrict(r.Body, &b)
	switch {
	case err != nil:
	case b.Index == nil:
		err = errBadRequest("index is required")
	case *b.Index < 0:
		err = errBadRequest(fmt.Sprintf("index must not be negative, got %d", *b.Index))
	case !nameRE.MatchString(name):
		err = fmt.Errorf("%w %q", controller.ErrUnknownRouting, name)
	}
	if err != nil {
		a.fail(w, "switch routing", err)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	if err := a.admin.SwitchRouting(ctx, principalOf(r.Context()).Name, name, *b.Index); err != nil {
		a.fail(w, "switch routing", err)
		return
	}
	writeJSON(w, http.StatusOK, ack{OK: true})
}

func (a *AdminHandler) reload(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), a.reloadTimeout)
	defer cancel()
	if err := a.reloader.Reload(ctx, principalOf(r.Context()).Name); err != nil {
		a.fail(w, "reload", err)
		return
	}
	writeJSON(w, http.StatusOK, ack{OK: true})
}

type proxiesResponse struct {
	Proxies []controller.ProxyView `json:"proxies"`
}

func (a *AdminHandler) proxies(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := activitypool.Filter{Upstream: q.Get("upstream")}
	err := onlyParams(q, "upstream", "state", "limit")
	if err == nil {
		f.Limit, err = listLimit(q)
	}
	if err == nil && len(q["upstream"]) > 1 {
		err = errBadRequest("upstream may be given once")
	}
	if err == nil && len(f.Upstream) > maxFilterString {
		err = errBadRequest(fmt.Sprintf("upstream longer than %d bytes", maxFilterString))
	}
	if err == nil {
		f.States, err = parseStates(q["state"])
	}
	if err != nil {
		a.fail(w, "proxies", err)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	ps, err := a.admin.Proxies(ctx, f)
	if err != nil {
		a.fail(w, "proxies", err)
		return
	}
	// The controller is trusted to bound the list, but this is the API's
	// promise, so it is enforced here as well.
	if len(ps) > f.Limit {
		ps = ps[:f.Limit]
	}
	if ps == nil {
		ps = []controller.ProxyView{}
	}
	writeJSON(w, http.StatusOK, proxiesResponse{Proxies: ps})
}

// auditJSON is management.AuditEntry on the wire.
type auditJSON struct {
	ID     int64     `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Target string    `json:"target"`
	Result string    `json:"result"`
}

type auditResponse struct {
	Entries []auditJSON `json:"entries"`
}

func (a *AdminHandler) audit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	err := onlyParams(q, "limit")
	var limit int
	if err == nil {
		limit, err = listLimit(q)
	}
	if err != nil {
		a.fail(w, "audit", err)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	es, err := a.admin.Audit(ctx, limit)
	if err != nil {
		a.fail(w, "audit", err)
		return
	}
	if len(es) > limit {
		es = es[:limit]
	}
	out := auditResponse{Entries: make([]auditJSON, 0, len(es))}
	for _, e := range es {
		out.Entries = append(out.Entries, auditJSON{ID: e.ID, At: e.At.UTC(), Actor: e.Actor, Action: e.Action, Target: e.Target, Result: e.Result})
	}
	writeJSON(w, http.StatusOK, out)
}

// onlyParams refuses unknown query parameters: a misspelt filter
// ("states=") would otherwise silently list everything.
func onlyParams(q url.Values, allowed ...string) error {
	for k := range q {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			return errBadRequest(fmt.Sprintf("unknown query parameter %q (allowed: %s)", k, strings.Join(allowed, ", ")))
		}
	}
	return nil
}

func listLimit(q url.Values) (int, error) {
	vs := q["limit"]
	switch len(vs) {
	case 0:
		return DefaultListLimit, nil
	case 1:
	default:
		return 0, errBadRequest("limit may be given once")
	}
	n, err := strconv.Atoi(vs[0])
	if err != nil || n < 1 || n > MaxListLimit {
		return 0, errBadRequest(fmt.Sprintf("limit must be an integer between 1 and %d", MaxListLimit))
	}
	return n, nil
}

// parseStates accepts state=A&state=B and state=A,B, case-insensitively.
func parseStates(vs []string) ([]proxy.State, error) {
	var out []proxy.State
	seen := map[proxy.State]bool{}
	for _, v := range vs {
		for _, name := range strings.Split(v, ",") {
			name = strings.ToUpper(strings.TrimSpace(name))
			if name == "" {
				continue
			}
			s, err := proxy.ParseState(name)
			if err != nil {
				return nil, errBadRequest(fmt.Sprintf("unknown state %q", name))
			}
			if !seen[s] {
				seen[s] = true
				out = append(out, s)
			}
		}
	}
	return out, nil
}

func nonNilMap(m map[string]int) map[string]int {
	if m == nil {
		return map[string]int{}
	}
	return m
}

var _ http.Handler = (*AdminHandler)(nil)
