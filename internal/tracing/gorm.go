package tracing

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"
)

// gormPlugin is GORM's OpenTelemetry instrumentation done by hand: a
// client span per statement, named by its kind (gorm.Query, gorm.Raw, …),
// with db.system.name=postgresql and db.query.text, the SQL without its
// arguments (which hold customers' emails). gorm.io/plugin/opentelemetry
// does the same, but imports the MySQL and ClickHouse drivers, which would
// then ship in every binary of a service that speaks only PostgreSQL.
type gormPlugin struct{}

func (gormPlugin) Name() string { return "checkout-tracing" }

// spanCtx keeps the context the statement had before its span, restored
// after it.
type spanCtx struct {
	context.Context
	parent context.Context
}

func (gormPlugin) Initialize(db *gorm.DB) error {
	cb := db.Callback()
	type register interface {
		Register(name string, fn func(*gorm.DB)) error
	}
	hooks := []struct {
		before, after register
		name          string
	}{
		{cb.Create().Before("gorm:create"), cb.Create().After("gorm:create"), "gorm.Create"},
		{cb.Query().Before("gorm:query"), cb.Query().After("gorm:query"), "gorm.Query"},
		{cb.Update().Before("gorm:update"), cb.Update().After("gorm:update"), "gorm.Update"},
		{cb.Delete().Before("gorm:delete"), cb.Delete().After("gorm:delete"), "gorm.Delete"},
		{cb.Row().Before("gorm:row"), cb.Row().After("gorm:row"), "gorm.Row"},
		{cb.Raw().Before("gorm:raw"), cb.Raw().After("gorm:raw"), "gorm.Raw"},
	}
	var errs []error
	for _, h := range hooks {
		name := h.name
		errs = append(errs, h.before.Register("tracing:before:"+name, func(tx *gorm.DB) {
			parent := tx.Statement.Context
			ctx, _ := Tracer().Start(parent, name, trace.WithSpanKind(trace.SpanKindClient))
			tx.Statement.Context = spanCtx{ctx, parent}
		}))
		errs = append(errs, h.after.Register("tracing:after:"+name, func(tx *gorm.DB) {
			c, ok := tx.Statement.Context.(spanCtx)
			if !ok {
				return
			}
			tx.Statement.Context = c.parent
			span := trace.SpanFromContext(c.Context)
			if span.IsRecording() {
				span.SetAttributes(attribute.String("db.system.name", "postgresql"),
					attribute.String("db.query.text", tx.Statement.SQL.String()),
					attribute.Int64("db.response.returned_rows", tx.Statement.RowsAffected))
			}
			err := tx.Error
			if errors.Is(err, gorm.ErrRecordNotFound) {
				err = nil // an answer, not a failure
			}
			End(span, err)
		}))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tracing: register gorm callbacks: %w", err)
	}
	return nil
}
