/* xml.h: reading the XML answers of object stores (S3 listings and errors,
 * WebDAV multistatus) without an XML library: elements by local name. */
#ifndef TP_STORE_XML_H
#define TP_STORE_XML_H

#include <stddef.h>

/* The first element <tag> (any namespace prefix) in [p, end): its text
 * between *text and *text_end; returns where the element ends, or NULL. */
const char *xml_element(const char *p, const char *end, const char *tag, const char **text, const char **text_end);

/* The text of an element into out (truncated to fit, never inside a
 * character): the five named entities decoded, and numeric character
 * references ("&#13;", "&#x1F600;": S3 escapes a key's control characters
 * so) written as UTF-8; an ampersand of neither is kept as it is. A
 * numeric reference naming no character (no digits or ';', 0, a
 * surrogate, past U+10FFFF) fails with TP_ERR_FORMAT naming it. */
int xml_text(const char *text, const char *text_end, char *out, size_t out_size);

/* A listing answer (root element `root`) the scanner can read: TP_OK, or
 * TP_ERR_FORMAT naming url for one holding a declaration (<!DOCTYPE,
 * <!ENTITY), nested deeper than any real listing, or without its root. */
int xml_check_listing(const char *body, size_t size, const char *root, const char *url);

#endif
