package httpbody

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/onceonly/checkout/internal/problem"
)

// Members is a JSON object decoded one level deep, for decoding a request
// body member by member: each wrong type is reported at its own path, and
// unknown members (matched exactly, unlike encoding/json's
// case-insensitive matching) beside every other error rather than instead
// of them. Errors are appended to the list Object was given.
type Members struct {
	path    string
	members map[string]json.RawMessage
	errs    *[]problem.FieldError
}

// Object decodes raw, the value at path ("" for the body), as a JSON
// object. When it is not one (null included) it appends {path,
// notObject} to errs and reports false.
func Object(raw []byte, path, notObject string, errs *[]problem.FieldError) (Members, bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		*errs = append(*errs, problem.FieldError{Field: path, Message: notObject})
		return Members{}, false
	}
	return Members{path: path, members: m, errs: errs}, true
}

// Path returns the path of member name: "name" in the body,
// "items[0].name" in the object at "items[0]".
func (o Members) Path(name string) string {
	if o.path == "" {
		return name
	}
	return o.path + "." + name
}

// Unknown appends "is not a known field" for each member not in known, in
// name order.
func (o Members) Unknown(known ...string) {
	for _, name := range slices.Sorted(maps.Keys(o.members)) {
		if !slices.Contains(known, name) {
			*o.errs = append(*o.errs, problem.FieldError{Field: o.Path(name), Message: "is not a known field"})
		}
	}
}

// OmitNulls drops the members whose value is null, so that a null member
// is decoded as if absent (after Unknown, which still reports them).
func (o Members) OmitNulls() {
	maps.DeleteFunc(o.members, func(_ string, v json.RawMessage) bool { return string(v) == "null" })
}

// Get returns member name's raw value and whether it is present.
func (o Members) Get(name string) (json.RawMessage, bool) {
	raw, ok := o.members[name]
	return raw, ok
}

// String decodes member name, when present, into dst, or appends "must
// be a string" (null included) at its path. An absent member is left to
// validation, which knows whether it is required.
func (o Members) String(name string, dst *string) {
	o.Decode(name, dst, "must be a string")
}

// Decode decodes member name, when present, into dst, or appends {its
// path, message} when it does not decode or is null. It reports whether
// a present member decoded (false for an absent one).
func (o Members) Decode(name string, dst any, message string) bool {
	raw, ok := o.members[name]
	if !ok {
		return false
	}
	if err := json.Unmarshal(raw, dst); err != nil || string(raw) == "null" {
		*o.errs = append(*o.errs, problem.FieldError{Field: o.Path(name), Message: message})
		return false
	}
	return true
}
