package client_test

import (
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/checkout/client"
)

// notInSpec lists the JSON fields the client has that api/openapi.yaml
// does not name yet, each with its reason. Anything else missing from the
// spec fails TestTypesFollowOpenAPI.
var notInSpec = map[string]string{
	"RefundStatus.requires_attention": "CONTRACT.md (v3) Refunds adds it; the spec's enum follows with the api's change",
}

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	doc, err := openapi3.NewLoader().LoadFromFile(filepath.Join(filepath.Dir(file), "..", "api", "openapi.yaml"))
	require.NoError(t, err)
	return doc
}

// properties returns the properties of s, through allOf.
func properties(s *openapi3.Schema) map[string]*openapi3.SchemaRef {
	out := map[string]*openapi3.SchemaRef{}
	for _, sub := range s.AllOf {
		for k, v := range properties(sub.Value) {
			out[k] = v
		}
	}
	for k, v := range s.Properties {
		out[k] = v
	}
	return out
}

// jsonFields returns the JSON names of t's fields, through embedded
// structs.
func jsonFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			for k := range jsonFields(f.Type) {
				out[k] = true
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}

// TestTypesFollowOpenAPI keeps the written types in step with
// api/openapi.yaml: every property of every schema the client sends or
// decodes has a field of that JSON name, every field is a property (or in
// notInSpec), and every enum value has a constant.
func TestTypesFollowOpenAPI(t *testing.T) {
	doc := loadSpec(t)
	schema := func(name string) *openapi3.Schema {
		ref := doc.Components.Schemas[name]
		require.NotNil(t, ref, "schema %s", name)
		return ref.Value
	}
	prop := func(s *openapi3.Schema, path ...string) *openapi3.Schema {
		for _, p := range path {
			if p == "[]" {
				s = s.Items.Value
				continue
			}
			ref := properties(s)[p]
			require.NotNil(t, ref, "property %s", p)
			s = ref.Value
		}
		return s
	}
	response := func(path, method, status, contentType string) *openapi3.Schema {
		op := doc.Paths.Find(path).GetOperation(method)
		require.NotNil(t, op, "%s %s", method, path)
		return op.Responses.Value(status).Value.Content.Get(contentType).Schema.Value
	}
	orderView := response("/v1/orders/{id}", "GET", "200", "application/json")
	products := response("/v1/products", "GET", "200", "application/json")
	require.Equal(t, schema("Product"), prop(products, "data", "[]"), "GET /v1/products data items")

	for _, tc := range []struct {
		goType  any
		schemas []*openapi3.Schema // properties of all of them, together
	}{
		{client.CheckoutRequest{}, []*openapi3.Schema{schema("CheckoutRequest")}},
		{client.Item{}, []*openapi3.Schema{prop(schema("CheckoutRequest"), "items", "[]")}},
		{client.Order{}, []*openapi3.Schema{schema("Order"), orderView}},
		{client.OrderItem{}, []*openapi3.Schema{prop(schema("Order"), "items", "[]")}},
		{client.Payment{}, []*openapi3.Schema{prop(schema("Order"), "payment")}},
		{client.NextAction{}, []*openapi3.Schema{prop(schema("Order"), "payment", "next_action")}},
		{client.RefundRequest{}, []*openapi3.Schema{schema("RefundRequest")}},
		{client.Refund{}, []*openapi3.Schema{schema("Refund"), prop(orderView, "refunds", "[]")}},
		{client.Notification{}, []*openapi3.Schema{schema("Notification"), prop(orderView, "notifications", "[]")}},
		{client.Product{}, []*openapi3.Schema{schema("Product")}},
		{client.Problem{}, []*openapi3.Schema{schema("Problem"),
			response("/v1/checkouts", "POST", "402", "application/problem+json"),
			response("/v1/orders/{id}/refunds", "POST", "409", "application/problem+json")}},
		{client.FieldError{}, []*openapi3.Schema{prop(schema("Problem"), "errors", "[]")}},
	} {
		typ := reflect.TypeOf(tc.goType)
		fields := jsonFields(typ)
		inSpec := map[string]bool{}
		for _, s := range tc.schemas {
			for name := range properties(s) {
				inSpec[name] = true
				require.True(t, fields[name], "%s has no field for the spec's property %q", typ.Name(), name)
			}
		}
		for name := range fields {
			if !inSpec[name] {
				_, ok := notInSpec[typ.Name()+"."+name]
				require.True(t, ok, "%s.%s is not in api/openapi.yaml (nor in notInSpec)", typ.Name(), name)
			}
		}
	}

	for _, tc := range []struct {
		name   string
		spec   *openapi3.Schema
		consts []string
	}{
		{"OrderStatus", prop(schema("Order"), "status"), strs(client.OrderPendingPayment, client.OrderRequiresAction,
			client.OrderPaymentUnknown, client.OrderPaid, client.OrderPaymentFailed, client.OrderCanceled,
			client.OrderPartiallyRefunded, client.OrderRefunded)},
		{"RefundStatus", prop(schema("Refund"), "status"), strs(client.RefundPending, client.RefundSucceeded,
			client.RefundFailed, client.RefundRequiresAttention)},
		{"RefundReason", prop(schema("RefundRequest"), "reason"), strs(client.ReasonRequestedByCustomer,
			client.ReasonDuplicate, client.ReasonFraudulent)},
		{"Code", prop(schema("Problem"), "code"), strs(client.CodeUnauthorized, client.CodeUnsupportedMediaType,
			client.CodePayloadTooLarge, client.CodeIdempotencyKeyMissing, client.CodeIdempotencyKeyInvalid,
			client.CodeMalformedJSON, client.CodeIdempotencyKeyReused, client.CodeIdempotencyKeyInUse,
			client.CodeValidationError, client.CodeCardDeclined, client.CodePaymentRejected, client.CodeOutOfStock,
			client.CodeOrderNotCancelable, client.CodePaymentProviderUnavailable, client.CodeInvalidSignature,
			client.CodeMalformedEvent, client.CodeUnavailable, client.CodeNotFound, client.CodeMethodNotAllowed,
			client.CodeInternal, client.CodeOrderNotRefundable, client.CodeRefundExceedsPayment, client.CodeRateLimited,
			client.CodeHeadersTooLarge)},
	} {
		var spec []string
		for _, v := range tc.spec.Enum {
			if s, ok := v.(string); ok {
				spec = append(spec, s)
			}
		}
		for _, v := range spec {
			require.Contains(t, tc.consts, v, "%s has no constant for the spec's %q", tc.name, v)
		}
		for _, v := range tc.consts {
			if !slices.Contains(spec, v) {
				_, ok := notInSpec[tc.name+"."+v]
				require.True(t, ok, "%s %q is not in api/openapi.yaml (nor in notInSpec)", tc.name, v)
			}
		}
	}
}

func strs[T ~string](vs ...T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}
