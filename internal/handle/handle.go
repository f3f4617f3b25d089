// Package handle tells whether a database handle given to idem can be used.
package handle

import "reflect"

// Missing reports whether h is nil, or an interface holding a nil pointer,
// map, slice, function or channel: a typed nil, such as a *pgxpool.Pool that
// was declared and never assigned, passed as an idem.DBTX. Calling a method
// on such a value would panic, so idem refuses it before any SQL.
func Missing(h any) bool {
	if h == nil {
		return true
	}
	v := reflect.ValueOf(h)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}
