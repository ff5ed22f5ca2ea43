//! Writing EC2's XML replies: `<ActionResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">`.

use std::fmt::Display;

use quick_xml::escape::escape;

use crate::error::Ec2Error;

/// EC2's XML namespace for API version 2016-11-15.
pub const NAMESPACE: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";

/// A small XML builder; every text value is escaped.
pub struct Xml {
    out: String,
}

impl Xml {
    /// Starts `<{action}Response xmlns=...><requestId>..</requestId>`.
    pub fn response(action: &str, request_id: &str) -> Self {
        let mut out = String::with_capacity(1024);
        out.push_str(r#"<?xml version="1.0" encoding="UTF-8"?>"#);
        out.push_str(&format!("<{action}Response xmlns=\"{NAMESPACE}\">"));
        let mut x = Self { out };
        x.leaf("requestId", request_id);
        x
    }

    pub fn open(&mut self, tag: &str) -> &mut Self {
        self.out.push('<');
        self.out.push_str(tag);
        self.out.push('>');
        self
    }

    pub fn close(&mut self, tag: &str) -> &mut Self {
        self.out.push_str("</");
        self.out.push_str(tag);
        self.out.push('>');
        self
    }

    pub fn leaf(&mut self, tag: &str, value: impl Display) -> &mut Self {
        self.open(tag);
        self.out.push_str(&escape(value.to_string()));
        self.close(tag)
    }

    /// Text content (escaped), e.g. the value of a list item that is a plain string.
    pub fn text(&mut self, value: impl Display) -> &mut Self {
        self.out.push_str(&escape(value.to_string()));
        self
    }

    /// `<tag><item>..</item>...</tag>` with `f` writing each item's content.
    pub fn set<T>(
        &mut self,
        tag: &str,
        items: impl IntoIterator<Item = T>,
        mut f: impl FnMut(&mut Self, T),
    ) -> &mut Self {
        self.open(tag);
        for it in items {
            self.open("item");
            f(self, it);
            self.close("item");
        }
        self.close(tag)
    }

    /// Ends the document.
    pub fn finish(mut self, action: &str) -> String {
        self.out.push_str(&format!("</{action}Response>"));
        self.out
    }
}

/// EC2's error document: `<Response><Errors><Error><Code>..`.
pub fn error(err: &Ec2Error, request_id: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>"#,
        escape(err.code.as_str()),
        escape(err.message.as_str()),
        escape(request_id)
    )
}
