// Package config loads a process's settings from environment variables with
// github.com/caarlos0/env/v11, from a getenv function so that tests can run
// a process's run function with their own environment.
package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"

	"github.com/caarlos0/env/v11"
)

// Load fills dst, a pointer to a struct with `env:"NAME"` and `envDefault`
// tags, from getenv. An empty value counts as unset, so the default applies.
// The error names every variable whose value does not parse, e.g.
// `IDEMPOTENCY_TTL="soon": time: invalid duration "soon"`.
func Load(getenv func(string) string, dst any) error {
	params, err := env.GetFieldParams(dst)
	if err != nil {
		return err
	}
	vars := map[string]string{}
	for _, p := range params {
		if v := getenv(p.Key); v != "" {
			vars[p.Key] = v
		}
	}
	err = env.ParseWithOptions(dst, env.Options{Environment: vars})
	if err == nil {
		return nil
	}
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	names := envNames(dst)
	msgs := make([]string, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			name := names[pe.Name]
			msgs = append(msgs, fmt.Sprintf("%s=%q: %v", name, vars[name], pe.Err))
			continue
		}
		msgs = append(msgs, e.Error())
	}
	return errors.New(strings.Join(msgs, "; "))
}

// envNames maps each field name of *dst, embedded structs included, to its
// variable name.
func envNames(dst any) map[string]string {
	m := map[string]string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(f.Type)
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
			m[f.Name] = name
		}
	}
	walk(reflect.TypeOf(dst).Elem())
	return m
}

// Masked returns the settings of *cfg as name/value pairs for logging, with
// the value of every field tagged `secret:"true"` masked and the password of
// every URL removed, in a comma-separated list of URLs too (AMQP_URL may
// name every node of a cluster, each with its credentials).
func Masked(cfg any) []any {
	return masked(reflect.ValueOf(cfg).Elem())
}

func masked(v reflect.Value) []any {
	t := v.Type()
	var out []any
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			out = append(out, masked(v.Field(i))...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" {
			continue
		}
		val := fmt.Sprint(v.Field(i).Interface())
		switch {
		case f.Tag.Get("secret") == "true":
			val = "***"
		case strings.Contains(val, "://") && strings.Contains(val, "@"):
			val = redactURLs(val)
		}
		val = passwordParam.ReplaceAllString(val, "${1}***")
		out = append(out, name, val)
	}
	return out
}

// passwordParam matches a password given as a parameter: in a URL's query
// (postgres://h1,h2/db?password=…) or in a libpq keyword/value string
// (host=h1,h2 password='…'), quoted or not.
var passwordParam = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s]+)`)

// redactURLs hides the password of every URL in s, a URL or a
// comma-separated list of them. A piece without "://" is left as it is:
// libpq's multi-host form (postgres://u:p@h1:5432,h2:5432/db) splits into
// a URL and a bare host:port/db.
func redactURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = redactURL(p)
	}
	return strings.Join(parts, ",")
}

// redactURL hides the password in scheme://user:password@host.
func redactURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	userinfo, host, ok := strings.Cut(rest, "@")
	if !ok {
		return s
	}
	if user, _, hasPass := strings.Cut(userinfo, ":"); hasPass {
		return scheme + "://" + user + ":***@" + host
	}
	return s
}
