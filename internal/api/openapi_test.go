package api_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/stretchr/testify/require"
)

var (
	specOnce   sync.Once
	specRouter routers.Router
	specErr    error
)

// spec loads api/openapi.yaml once, validates it, and returns a router over
// it that matches any host.
func spec(t testing.TB) routers.Router {
	t.Helper()
	specOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		path := filepath.Join(filepath.Dir(file), "..", "..", "api", "openapi.yaml")
		doc, err := openapi3.NewLoader().LoadFromFile(path)
		if err != nil {
			specErr = err
			return
		}
		doc.Servers = nil // match the test server's host
		specRouter, specErr = legacy.NewRouter(doc)
	})
	require.NoError(t, specErr, "api/openapi.yaml")
	return specRouter
}

// checkAgainstSpec validates a response the API gave against
// api/openapi.yaml: status, headers and body schema. Requests are not
// validated, because tests send invalid ones on purpose.
func checkAgainstSpec(t testing.TB, req *http.Request, r reply) {
	t.Helper()
	route, params, err := spec(t).FindRoute(req)
	if err != nil {
		return // a route the spec does not describe (e.g. a 404 for an unknown path)
	}
	in := &openapi3filter.RequestValidationInput{
		Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 r.status,
		Header:                 r.header,
		Body:                   io.NopCloser(bytes.NewReader(r.body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true},
	}
	err = openapi3filter.ValidateResponse(context.Background(), out)
	require.NoError(t, err, "%s %s answered %d %s, which api/openapi.yaml does not allow", req.Method, req.URL.Path, r.status, r.body)
}

// TestOpenAPIDocument: the document itself is valid OpenAPI 3.
func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	spec(t)
}
